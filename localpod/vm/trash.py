"""The old disks of recreated workers, deleted only while no worker boots.

A create moves each old worker directory aside at once (a rename) instead of deleting it: on
GCP an old VM's disk goes away on Google's side, never on the new VM's CPU or disk. Deleting it
here right away (its uv cache and .venv: ~15,000 files, ~1 GB a worker) beside the new workers'
own unpacking of as much made their bootstrap seconds slower: a cost of the test bed that GCP
has not, in every cold-recreate figure (`nice` and `ionice` do not help: ext4's journal is
shared, and `ionice -c 3` means nothing to mq-deadline). So the pod deletes its trash while it
is quiet: every worker booted and its job training (status.json says so, heartbeat fresh: not
starting, restoring or compiling after a boot, a crash or a hang), in small batches, pausing as
soon as that ends. An entry waiting longer than MAX_WAIT_S is
deleted anyway, so a worker that never finishes a boot cannot fill the disk.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

FRESH_S = 5.0  # the trainer's status heartbeat comes every 2 s (trainer.config)
MAX_WAIT_S = 120.0
BATCH = 200  # unlinks between two looks at the pod
POLL_S = 0.2
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
    """One daemon thread deleting `root`/trash's entries, oldest first, while `quiet()`."""

    def __init__(self, root: Path, quiet: Callable[[], bool] | None = None,
                 max_wait_s: float = MAX_WAIT_S, poll_s: float = POLL_S) -> None:  # fmt: skip
        self.trash = root / "trash"
        self.quiet = quiet or (lambda: workers_quiet(root))
        self.max_wait_s = max_wait_s
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trash-reaper", daemon=True)

    def start(self) -> Reaper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, then delete what is left now (the workers are gone)."""
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

    def _may_delete(self, since: float) -> bool:
        """Wait until the pod is quiet or the entry waited MAX_WAIT_S; False once stopped."""
        while not self._stop.is_set():
            if self.quiet() or time.time() - since > self.max_wait_s:
                return True
            self._stop.wait(self.poll_s)
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            entries = self._entries()
            if not entries:
                self._stop.wait(self.poll_s)
                continue
            self._delete(entries[0], since=trashed_at(entries[0]))

    def _delete(self, entry: Path, since: float) -> None:
        """Bottom-up, BATCH unlinks at a time, asking again before each batch."""
        done = 0
        for top, dirs, files in os.walk(entry, topdown=False):
            for name in files + dirs:
                if done % BATCH == 0 and not self._may_delete(since):
                    return
                path = os.path.join(top, name)
                try:
                    if name in dirs and not os.path.islink(path):
                        os.rmdir(path)
                    else:
                        os.unlink(path)
                except OSError:
                    pass  # shutil.rmtree below takes what is left
                done += 1
        shutil.rmtree(entry, ignore_errors=True)
