"""`tpupod watch` as a laptop runs it (the demo's recovery on the Compute Engine path, whose
stacks declare no watcher VM): a child process of the demo, as the operator, holding the lease
in the bucket as `laptop`; stopped by its own process group, whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from ops.cloud.target import ROOT, STATE_DIR_ENV

HOLDER = "laptop"


class LaptopWatch:
    def __init__(self, pod_dir: Path, watch_args: str) -> None:
        self.dir = Path(pod_dir) / "laptop-watch"
        self.log = self.dir / "watch.log"
        self.args = watch_args.split()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, STATE_DIR_ENV: str(self.dir)}
        command = [sys.executable, "-m", "ops", "watch", "--stack", "local", "--pod-dir",
                   str(self.dir.parent), "--holder", HOLDER, *self.args]  # fmt: skip
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to its whole process group (its SSH and IAP children too, even when the
        watch itself has exited), SIGKILL after `timeout`; never raises."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self.proc = None
