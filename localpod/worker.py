"""One worker of the local pod: `python -m localpod.worker AGENT_JSON`.

The agent is the worker's "VM": its own session (the controller starts it with
start_new_session), a child subreaper so that trainers detached with setsid stay its descendants,
the worker's SSH server, and, like GCE's guest agent, it fetches `startup-script` from the
metadata server at boot and runs it with bash, logging to the worker's directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from localpod import procs, sshserver
from localpod.state import read_json

SHUTDOWN_GRACE_S = 2.0


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
    url = f"http://{metadata_host}/computeMetadata/v1/instance/attributes/startup-script"
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


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}", flush=True)


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
            cfg["env"],
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
    acceptor = await sshserver.serve(
        cfg["address"],
        cfg["ssh_port"],
        host_key=Path(cfg["host_key"]),
        authorized_keys=Path(cfg["authorized_keys"]),
        env=cfg["env"],
        home=Path(cfg["home"]),
        spawn=reaper.spawn,
    )
    Path(cfg["ready_file"]).write_text(str(os.getpid()))
    _log(f"worker {cfg['index']}: ssh on {cfg['address']}:{cfg['ssh_port']}")
    boot = asyncio.ensure_future(run_startup_script(cfg, reaper))
    await stop.wait()
    _log(f"worker {cfg['index']}: shutting down")
    boot.cancel()
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
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(config))
