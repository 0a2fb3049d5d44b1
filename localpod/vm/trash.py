"""The old disks of recreated workers, deleted only while no worker boots.

A create moves each old worker directory aside at once (a rename) instead of deleting it: on
GCP an old VM's disk goes away on Google's side, never on the new VM's CPU or disk. Deleting it
here right away (its uv cache and .venv: ~15,000 files, ~1 GB a worker) put the test bed's own
disk work inside the new workers' boots, which unpack as much: a cost GCP has not, in every
cold-recreate figure (`nice` and `ionice` do not keep it out: ext4's journal is shared, and
`ionice -c 3` means nothing to mq-deadline). How much it cost is not separable here from this
machine's disk, which throttles sustained writes (README, *Known limits*). So the pod deletes
its trash while it is quiet: every worker booted and its job training (status.json says so,
heartbeat fresh: not starting, restoring or compiling after a boot, a crash or a hang), with an
`rm` stopped within POLL_S as soon as that ends. An entry waiting longer than MAX_WAIT_S is
deleted anyway, so a worker that never finishes a boot cannot fill the disk.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

FRESH_S = 5.0  # the trainer's status heartbeat comes every 2 s (trainer.config)
MAX_WAIT_S = 120.0
POLL_S = 0.1  # how soon a boot that begins stops the deletion
RM = ("nice", "-n", "19", "rm", "-rf", "--one-file-system")
FINAL_STATES = ("ok", "failed")


def move_to_trash(root: Path, path: Path) -> Path | None:
    """Rename `path` into the pod's trash (instant: same filesystem); None if it is absent."""
    if not path.exists():
        return None
    trash = root / "trash" / f"{path.name}-{time.time_ns()}"
    trash.parent.mkdir(exist_ok=True)
    path.rename(trash)
    return trash


def trashed_at(entry: Path) -> float:
    """When move_to_trash renamed `entry` (its name's suffix), in seconds since the epoch."""
    try:
        return int(entry.name.rsplit("-", 1)[1]) / 1e9
    except (IndexError, ValueError):
        return 0.0  # not ours: oldest, and past any wait


def workers_quiet(root: Path, now: float | None = None) -> bool:
    """Every worker of the pod at `root` booted (bootstrap.json ended) and its job trains (its
    status.json: state `training`, heartbeat within FRESH_S). A worker directory without them is
    booting, or its job starting or stopped: not quiet (MAX_WAIT_S bounds the wait)."""
    now = time.time() if now is None else now
    for worker in (root / "workers").glob("*"):
        if not worker.is_dir():
            continue
        boot, job = (
            _json(worker / "tpupod" / "bootstrap.json"),
            _json(worker / "tpupod" / "status.json"),
        )
        if boot.get("state") not in FINAL_STATES or job.get("state") != "training":
            return False
        if now - float(job.get("heartbeat") or 0) > FRESH_S:
            return False
    return True


def _json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


class Reaper:
    """One daemon thread deleting `root`/trash's entries, oldest first, while `quiet()`: each with
    an `rm -rf` of its own (a C loop, not this process's GIL, which serves the pod's APIs),
    stopped (SIGSTOP) whenever the pod is not quiet and continued (SIGCONT) when it is again."""

    def __init__(self, root: Path, quiet: Callable[[], bool] | None = None,
                 max_wait_s: float = MAX_WAIT_S, poll_s: float = POLL_S,
                 command: tuple[str, ...] = RM) -> None:  # fmt: skip
        self.trash = root / "trash"
        self.quiet = quiet or (lambda: workers_quiet(root))
        self.max_wait_s = max_wait_s
        self.poll_s = poll_s
        self.command = command
        self.rm: subprocess.Popen | None = None  # the one running now (tests look at it)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trash-reaper", daemon=True)

    def start(self) -> Reaper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (and its rm), then delete what is left now (the workers are gone)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for entry in self._entries():
            shutil.rmtree(entry, ignore_errors=True)

    def _entries(self) -> list[Path]:
        try:
            return sorted(self.trash.iterdir(), key=trashed_at)
        except OSError:
            return []

    def _allowed(self, since: float) -> bool:
        return self.quiet() or time.time() - since > self.max_wait_s

    def _run(self) -> None:
        while not self._stop.is_set():
            entries = self._entries()
            if entries and self._allowed(since := trashed_at(entries[0])):
                self._delete(entries[0], since)
            else:
                self._stop.wait(self.poll_s)

    def _delete(self, entry: Path, since: float) -> None:
        self.rm = rm = subprocess.Popen(
            [*self.command, str(entry)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        running = True
        try:
            while rm.poll() is None and not self._stop.is_set():
                if self._allowed(since) != running:
                    running = not running
                    rm.send_signal(signal.SIGCONT if running else signal.SIGSTOP)
                self._stop.wait(self.poll_s)
        finally:
            if rm.poll() is None:  # stopping: stop's own rmtree takes what is left
                rm.kill()
                rm.send_signal(signal.SIGCONT)
                rm.wait()
            self.rm = None
        if rm.returncode not in (0, -signal.SIGKILL):
            shutil.rmtree(entry, ignore_errors=True)  # what rm could not, never in a loop
