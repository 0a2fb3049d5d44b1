"""The trainer's side of the status file (contract.status: the names it writes are the ones ops
reads): one small JSON file per process.

The trainer rewrites it atomically (tmp + rename) at least every log interval; the ops layer reads
it over SSH and judges health from `state`, `exit_code` and the heartbeat age.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path

import tpupod_job

from contract.status import STARTING_STATES, JobState, StatusReport


class StatusFile:
    """Writes this process's status; a no-op when no path is configured."""

    def __init__(self, path: str | os.PathLike | None, process_id: int = 0):
        self.path = Path(path) if path else None
        self.status = StatusReport(process_id=process_id, pid=os.getpid(), heartbeat=time.time())

    def update(self, **changes) -> StatusReport:
        for key, value in changes.items():
            setattr(self.status, key, value)
        self.status.heartbeat = time.time()
        if self.path is not None:  # written as any job writes it: tpupod_job's atomic writer
            tpupod_job.write_status(asdict(self.status), self.path)
        return self.status


def read_status(path: str | os.PathLike) -> StatusReport | None:
    """A status file as this trainer wrote it (tests and tools read their own runs with it)."""
    try:
        raw = json.loads(Path(path).read_text())
        known = {k: v for k, v in raw.items() if k in StatusReport.__dataclass_fields__}
        known["state"] = JobState(known.get("state", JobState.INITIALIZING))
        return StatusReport(**known)
    except (FileNotFoundError, ValueError):
        return None


# The states that beat however long they last are the starting ones: a restore of a large
# checkpoint and a first compile take minutes, bounded by the watcher's startup limit instead of
# the stall rule.


class Heartbeat:
    """Thread-safe status file plus a background heartbeat, so long steps never look hung.

    The background beat stops once the training loop has made no progress (no `update` from the
    main thread) for `stall_seconds`: a deadlocked step then shows a stale heartbeat, as ops expects.
    """

    def __init__(self, path, process_id: int, interval: float, stall_seconds: float = 600.0):
        self._file = StatusFile(path, process_id)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._progress = time.time()
        self._stall = stall_seconds
        self._thread = threading.Thread(target=self._beat, args=(interval,), daemon=True)
        self._thread.start()

    @property
    def status(self):
        return self._file.status

    def update(self, **changes) -> None:
        with self._lock:
            self._progress = time.time()
            self._file.update(**changes)

    def _beat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            waiting = self._file.status.state in STARTING_STATES
            if not waiting and time.time() - self._progress > self._stall:
                continue
            with self._lock, contextlib.suppress(OSError):
                self._file.update()

    def stop(self) -> None:
        self._stop.set()
