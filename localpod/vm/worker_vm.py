"""One worker VM of the local pod, as a create makes it: a wiped disk, a fresh SSH host key, the
client's authorized key, and the agent process (localpod.vm.worker) that serves its SSH. The slice's
lifecycle (localpod.vm.slice) decides when; this module only builds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from localpod.state import PodPaths, write_json
from localpod.vm import memory, trash
from localpod.vm.environment import image_bin, registry_unreachable_env, worker_env


@dataclass(frozen=True)
class Instance:
    """What GCE tells about one worker VM: its instance name and its SSH host key."""

    hostname: str
    host_key: str  # base64 ed25519 public key, as guest attributes serve it


def write_ed25519_key(path: Path, comment: str) -> str:
    """A new OpenSSH ed25519 key pair at path (+ .pub); returns the public key's base64."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = asyncssh.generate_private_key("ssh-ed25519", comment=comment)
    key.write_private_key(path, "openssh")
    path.chmod(0o600)
    key.write_public_key(path.with_name(path.name + ".pub"), "openssh")
    return key.export_public_key("openssh").decode().split()[1]


def boot(
    paths: PodPaths, layout: dict, index: int, hostname: str
) -> tuple[subprocess.Popen, Instance]:
    """A fresh disk (wiped worker dir), host key and authorized_keys, then the agent."""
    worker_dir = paths.worker(index)
    trash.move_to_trash(paths.root, worker_dir)  # deleted later, while every job trains
    memory_dir = memory.empty(paths.root, index)  # a new VM's memory holds nothing either
    host_key = write_ed25519_key(paths.host_key(index), comment=f"root@{hostname}")
    home = paths.home(index)
    (home / ".ssh").mkdir(parents=True)
    authorized = home / ".ssh" / "authorized_keys"
    shutil.copyfile(paths.client_key.with_name("id_ed25519.pub"), authorized)
    address = layout["addresses"][index]
    config = {
        "index": index,
        "address": address,
        "ssh_port": layout["ssh_ports"][index],
        "home": str(home),
        "worker_dir": str(worker_dir),
        "host_key": str(paths.host_key(index)),
        "authorized_keys": str(authorized),
        "ready_file": str(paths.agent_ready(index)),
        "env": worker_env(
            home=home,
            image=image_bin(paths.root),
            tpupod_root=paths.tpupod_root(index),
            metadata_host=f"{address}:{layout['metadata_port']}",
            emulator_url=f"http://{address}:{layout['emulator_port']}",  # its own URL
            devices_per_worker=layout["devices_per_worker"],
            memory_dir=memory_dir,
            secretmanager_url=layout.get("secretmanager_url"),
        ),
    }
    if paths.registry_unreachable.exists():  # `LocalPod.package_index(reachable=False)`
        config["env"].update(registry_unreachable_env(layout["addresses"]))
    write_json(paths.agent_config(index), config)
    return start_agent(paths, index), Instance(hostname=hostname, host_key=host_key)


def start_agent(paths: PodPaths, index: int) -> subprocess.Popen:
    """The worker's agent (sshd, metadata-fed startup script) on the disk it has: at a first
    boot, and again after a reboot (host maintenance), same host key and instance."""
    paths.agent_ready(index).unlink(missing_ok=True)
    with (paths.worker(index) / "agent.log").open("ab") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "localpod.vm.worker", str(paths.agent_config(index))],
            cwd=paths.home(index),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return popen


def write_known_hosts(paths: PodPaths, layout: dict, instances: list[Instance]) -> None:
    """`[IP]:PORT` and the instance name per worker, so plain ssh can check strictly."""
    lines = []
    for index, instance in enumerate(instances):
        address, port = layout["addresses"][index], layout["ssh_ports"][index]
        for name in (f"[{address}]:{port}", instance.hostname):
            lines.append(f"{name} ssh-ed25519 {instance.host_key}\n")
    tmp = paths.known_hosts.with_name(".known_hosts.tmp")
    tmp.write_text("".join(lines))
    os.replace(tmp, paths.known_hosts)
