"""One worker of the local pod: `python -m localpod.vm.worker AGENT_JSON`.

The agent is the worker's "VM": its own session (the controller starts it with
start_new_session), a child subreaper so that trainers detached with setsid stay its descendants,
the worker's SSH server (logins as the unprivileged login user when the pod runs as root), the
pod's sudo for that user, and, like GCE's guest agent, it fetches `startup-script` from the
metadata server at boot and runs it with bash as root, logging to the worker's directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from localpod import procs
from localpod.state import read_json
from localpod.vm import privilege, sshserver
from localpod.vm.sudo import SudoSpool, write_shim

SHUTDOWN_GRACE_S = 2.0
CLONE_NEWUTS, CLONE_NEWNS = 0x04000000, 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000


class Reaper:
    """Waits for every child, including orphans re-parented to this subreaper.

    All waiting happens here (SIGCHLD -> waitpid(-1)); spawned children register a future in the
    same loop step that starts them, so no exit status can be lost or stolen.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: dict[int, tuple[subprocess.Popen, asyncio.Future]] = {}
        loop.add_signal_handler(signal.SIGCHLD, self.reap)

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path, **kwargs):
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        popen = subprocess.Popen(argv, env=env, cwd=cwd, **{**pipes, **kwargs})
        future = self._loop.create_future()
        self._waiters[popen.pid] = (popen, future)
        return popen, future

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            popen, future = self._waiters.pop(pid, (None, None))
            if popen is not None:
                popen.returncode = os.waitstatus_to_exitcode(status)
                if not future.done():
                    future.set_result(popen.returncode)


def fetch_startup_script(metadata_host: str, timeout: float = 30.0) -> str | None:
    """The script from metadata as the guest agent reads it; None when the key is unset."""
    return fetch_metadata(metadata_host, "instance/attributes/startup-script", timeout)


def fetch_metadata(metadata_host: str, path: str, timeout: float = 30.0) -> str | None:
    """A value from the metadata server, retried while it is unreachable; None for a 404."""
    url = f"http://{metadata_host}/computeMetadata/v1/{path}"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                return resp.read().decode()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def adopt_hostname(cfg: dict) -> str | None:
    """As on a TPU VM, the OS hostname is the instance name and /etc/hosts resolves it to the
    worker's address (GCE's guest agent adds that line; gloo resolves its own hostname). Root
    only: the agent takes UTS and mount namespaces of its own, so the host is untouched; a
    developer's pod keeps the host's name. Returns the name, None when it stays the host's."""
    if os.geteuid() != 0:
        return None
    host = cfg["env"]["GCE_METADATA_HOST"]
    name = fetch_metadata(host, "instance/name", timeout=10)
    fqdn = fetch_metadata(host, "instance/hostname", timeout=10)
    if not name or not fqdn:
        return None
    hosts = Path(cfg["worker_dir"]) / "hosts"
    original = Path("/etc/hosts").read_text()
    hosts.write_text(f"{original}{cfg['address']} {fqdn} {name}  # Added by Google\n")
    hosts.chmod(0o644)
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.unshare(CLONE_NEWUTS | CLONE_NEWNS) != 0:
        return None
    # Private first, so that the bind mount below can never show up outside this worker.
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return None
    if libc.mount(os.fsencode(hosts), b"/etc/hosts", None, MS_BIND, None) != 0:
        return None
    socket.sethostname(name)
    return name


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}", flush=True)


def root_env(cfg: dict) -> dict[str, str]:
    """The environment of the worker's root processes: the pod's sudo first on PATH."""
    env = dict(cfg["env"])
    env["PATH"] = f"{Path(cfg['worker_dir']) / 'bin'}:{env.get('PATH', '')}"
    return env


def prepare_vm(cfg: dict, user: privilege.Login) -> None:
    """What the image gives a TPU VM: the login's HOME is theirs (reachable through the pod's
    dirs), root's files default to 0644/0755 (the login can read, not write, trainer files)."""
    os.umask(0o022)
    if user.drops_root:
        os.setgroups([])  # root's groups must not leak into the login's file access
    home = Path(cfg["home"])
    privilege.give_tree(home, user)
    privilege.open_traverse(home, user)


async def run_startup_script(cfg: dict, reaper: Reaper) -> None:
    worker_dir = Path(cfg["worker_dir"])
    loop = asyncio.get_running_loop()
    try:
        script = await loop.run_in_executor(
            None, fetch_startup_script, cfg["env"]["GCE_METADATA_HOST"]
        )
    except (OSError, urllib.error.URLError) as err:
        _log(f"startup-script: cannot fetch it from metadata: {err}")
        return
    if script is None:
        _log("startup-script: no startup-script in metadata")
        return
    path = worker_dir / "startup-script.sh"
    path.write_text(script)
    log_path = worker_dir / "startup-script.log"
    _log(f"startup-script: running, log {log_path}")
    with log_path.open("ab") as log:
        _, exited = reaper.spawn(
            ["bash", str(path)],
            root_env(cfg),
            Path("/"),  # as GCE's guest agent: not the worker's HOME
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    code = await exited
    _log(f"startup-script exit status {code}")


async def main(cfg: dict) -> None:
    loop = asyncio.get_running_loop()
    reaper = Reaper(loop)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    user = privilege.login()
    prepare_vm(cfg, user)
    worker_dir = Path(cfg["worker_dir"])
    env = root_env(cfg)
    write_shim(worker_dir / "bin", worker_dir / "sudo-spool", user, os.getpid())
    sudo = asyncio.ensure_future(
        SudoSpool(worker_dir / "sudo-spool", user, env, reaper.spawn).serve()
    )
    acceptor = await sshserver.serve(
        cfg["address"],
        cfg["ssh_port"],
        host_key=Path(cfg["host_key"]),
        authorized_keys=Path(cfg["authorized_keys"]),
        env=env,
        home=Path(cfg["home"]),
        spawn=reaper.spawn,
        user=user,
    )
    Path(cfg["ready_file"]).write_text(str(os.getpid()))
    _log(f"worker {cfg['index']}: ssh on {cfg['address']}:{cfg['ssh_port']}")
    boot = asyncio.ensure_future(run_startup_script(cfg, reaper))
    await stop.wait()
    _log(f"worker {cfg['index']}: shutting down")
    boot.cancel()
    sudo.cancel()
    acceptor.close()
    # The whole worker goes down with its agent, as a VM takes its processes with it.
    await loop.run_in_executor(
        None, lambda: procs.kill_tree(os.getpid(), include_root=False, grace=SHUTDOWN_GRACE_S)
    )
    reaper.reap()


if __name__ == "__main__":
    config = read_json(Path(sys.argv[1]))
    if config is None:
        sys.exit(f"worker: cannot read {sys.argv[1]}")
    procs.set_subreaper()
    os.chdir(config["home"])
    with contextlib.suppress(OSError, urllib.error.URLError):
        adopt_hostname(config)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(config))
