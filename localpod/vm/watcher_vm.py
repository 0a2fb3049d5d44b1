"""The local pod's watcher VM: one more "VM" beside the workers, as infra/watcher_vm.py declares on GCP.

It has its own address (127.0.K.200) and its own metadata server there, serving what the Pulumi
program puts in the watcher's metadata (bootstrap/watcher-startup.sh as `startup-script`, the node
spec, stack and bucket, its service account), and boots by running that startup script. The script
starts `tpupod watch` under its restart-always supervisor; `watch` talks to the pod's TPU API and
bucket (the GCS emulator), and reaches the workers as its OS Login user (localpod.gcp.oslogin). The
code is this checkout (`TPUPOD_WATCHER_CODE`): the bundle carries no ops code to sync.

`python -m localpod.vm.watcher_vm POD_DIR` runs it until SIGTERM (then stops the supervisor's
process group); `start(pod_dir)` / `stop(pod_dir)` do that detached, the pid in watcher/vm.pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from localpod import procs
from localpod.gcp import identities, tokens
from localpod.gcp.authz import POLICY_FILE
from localpod.gcp.iam_policy import Policy
from localpod.vm.metadata_server import MetadataServer, MetadataStore

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bootstrap" / "watcher-startup.sh"
UNIT = ROOT / "bootstrap" / "tpupod-watcher.service"
HOLDER = "tpupod-local-watcher"


def vm_dir(pod_dir: Path) -> Path:
    return Path(pod_dir) / "watcher"


def address(pod: dict) -> str:
    """Its address in the pod's own 127.0.K.0/24 (localpod.controller chose it)."""
    return pod["watcher_address"]


def metadata(pod_dir: Path, endpoints: dict) -> dict[str, str]:
    spec = Path(endpoints["spec_file"]).read_text()
    return {
        "startup-script": SCRIPT.read_text(),
        "tpupod-watcher-unit": UNIT.read_text(),
        "tpupod-node-spec": spec,
        "tpupod-stack": "local",
        "tpupod-bucket": endpoints["bucket"],
        "enable-oslogin": "TRUE",
        "block-project-ssh-keys": "TRUE",
    }


def account(pod_dir: Path) -> str:
    """The stack's watcher service account (the pod's IAM policy)."""
    return _policy(pod_dir).accounts["watcher"]


def _policy(pod_dir: Path) -> Policy:
    return Policy.from_json(json.loads((Path(pod_dir) / POLICY_FILE).read_text()))


def run(pod_dir: Path) -> int:
    pod_dir = Path(pod_dir).resolve()
    pod = json.loads((pod_dir / "pod.json").read_text())
    endpoints = json.loads((pod_dir / "endpoints.json").read_text())
    here = vm_dir(pod_dir)
    root = here / "root"
    root.mkdir(parents=True, exist_ok=True)
    store = MetadataStore(token_key=tokens.read_key(pod_dir))
    store.set_attributes({0: metadata(pod_dir, endpoints)}, {0: HOLDER})
    store.set_node(service_account=account(pod_dir), node_id="tpupod-local-watcher")
    ip = address(pod)
    server = MetadataServer([ip], pod["metadata_port"], store)
    server.start()
    env = {
        **os.environ,
        "TPUPOD_ROOT": str(root),
        "GCE_METADATA_HOST": f"{ip}:{pod['metadata_port']}",
        "STORAGE_EMULATOR_HOST": f"http://{ip}:{pod['emulator_port']}",  # its own URL
        "TPUPOD_OSLOGIN_ENDPOINT": endpoints["oslogin"],
        "TPUPOD_POD_DIR": str(pod_dir),
        "TPUPOD_WATCH_HOLDER": HOLDER,
        "TPUPOD_WATCHER_CODE": str(ROOT),
        "TPUPOD_WATCHER_RESTART_S": os.environ.get("TPUPOD_WATCHER_RESTART_S", "1"),
        "TPUPOD_NO_SYSTEMD": "1",
    }
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    with (here / "boot.log").open("ab") as log:
        boot = subprocess.run(["bash", str(SCRIPT)], env=env, cwd=root, stdin=subprocess.DEVNULL,
                              stdout=log, stderr=subprocess.STDOUT, check=False)  # fmt: skip
    try:
        while not stopping and boot.returncode == 0:
            time.sleep(0.2)
    finally:
        supervisor = root / "watcher.pid"
        if supervisor.exists():
            with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                os.killpg(int(supervisor.read_text()), signal.SIGTERM)
        server.stop()
    return boot.returncode


def start(pod_dir: Path, watch_args: str | None = None) -> int:
    """The watcher VM, detached; its pid (also in watcher/vm.pid). `watch_args`: extra
    `tpupod watch` flags (TPUPOD_WATCH_ARGS), e.g. the demo's shorter hang timeout."""
    identities.add_watcher(pod_dir, _policy(pod_dir), Path(pod_dir) / "endpoints.json")
    here = vm_dir(pod_dir)
    here.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **({"TPUPOD_WATCH_ARGS": watch_args} if watch_args is not None else {})}
    with (here / "vm.log").open("ab") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "localpod.vm.watcher_vm", str(Path(pod_dir).resolve())],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=env,
        )  # fmt: skip
    (here / "vm.pid").write_text(f"{popen.pid} {procs.start_time(popen.pid) or 0}")
    return popen.pid


def stop(pod_dir: Path, timeout: float = 20.0) -> bool:
    """Stop the watcher VM started by `start` (by its recorded pid and start time)."""
    path = vm_dir(pod_dir) / "vm.pid"
    try:
        pid, started = path.read_text().split()
    except (OSError, ValueError):
        return False
    pid_i, start_f = int(pid), (int(started) or None)
    if procs.alive(pid_i, start_f):
        os.kill(pid_i, signal.SIGTERM)
        if not procs.wait_gone(pid_i, start_f, timeout=timeout):
            procs.kill_tree(pid_i, include_root=True)
    path.unlink(missing_ok=True)
    return True


def running(pod_dir: Path) -> bool:
    """The watcher VM started by `start` is still up (its recorded pid and start time)."""
    try:
        pid, started = (vm_dir(pod_dir) / "vm.pid").read_text().split()
    except (OSError, ValueError):
        return False
    return procs.alive(int(pid), int(started) or None)


def watch_pid(pod_dir: Path) -> int | None:
    """The running `tpupod watch` of the VM (tests kill it to show the supervisor restarts it)."""
    try:
        return int((vm_dir(pod_dir) / "root" / "watch.pid").read_text())
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
