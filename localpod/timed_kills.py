"""Job kills timed to what the job is doing: SIGKILL a worker's job once its status file says
it is in a given state (the fault campaign's kill during a restore: `restoring` lasts about a
second on `tiny`, far shorter than a watcher's poll, so the controller watches the worker's
status file itself, every few milliseconds, on the same disk).

A kill is armed before the fault that leads to the state (the crash whose restart restores), so
no restart can slip in between; it fires once, at the first status of another process than the
one running when it was armed, `delay` seconds after that status first said `state`, and keeps
what it found: the state the status file said just before the kill, whether it fired at all.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.01


def _status(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not written yet, or a worker's disk being wiped
        return None


class TimedKills:
    """The controller's armed kills; `signal_job(worker, sig) -> pid` does the killing."""

    def __init__(self, status_file: Callable[[int], Path], signal_job) -> None:
        self._status_file = status_file
        self._signal_job = signal_job
        self._lock = threading.Lock()
        self.records: list[dict] = []

    def arm(
        self,
        worker: int,
        state: str,
        delay: float = 0.3,
        timeout: float = 600.0,
        same_process: bool = False,
    ) -> dict:
        """`same_process`: the job running now may be the one killed (a kill during its next
        save), not only a process started after the arming (a kill during a restart's restore)."""
        before = _status(self._status_file(worker)) or {}
        record = {"worker": worker, "state": state, "delay": delay, "armed": time.time(),
                  "pid_before": None if same_process else before.get("pid"), "fired": None,
                  "state_at_kill": None, "pid": None, "error": None}  # fmt: skip
        with self._lock:
            self.records.append(record)
        threading.Thread(target=self._watch, args=(record, timeout), daemon=True).start()
        return dict(record)

    def report(self) -> list[dict]:
        with self._lock:
            return [dict(r) for r in self.records]

    def _watch(self, record: dict, timeout: float) -> None:
        path = self._status_file(record["worker"])
        deadline = time.monotonic() + timeout
        seen = None  # when the new process's status first said the state
        while time.monotonic() < deadline:
            status = _status(path) or {}
            mine = status.get("pid") not in (None, record["pid_before"])
            if seen is None and mine and status.get("state") == record["state"]:
                seen = time.monotonic()
            if seen is not None and time.monotonic() - seen >= record["delay"]:
                self._fire(record, path)
                return
            time.sleep(POLL_S)
        with self._lock:
            record["error"] = f"no status {record['state']!r} within {timeout:g}s"

    def _fire(self, record: dict, path: Path) -> None:
        at_kill = (_status(path) or {}).get("state")
        try:
            pid = self._signal_job(record["worker"], signal.SIGKILL)
        except Exception as err:  # noqa: BLE001 - kept in the record: the caller judges it
            with self._lock:
                record["error"] = f"{type(err).__name__}: {err}"
            return
        with self._lock:
            record.update(fired=time.time(), state_at_kill=at_kill, pid=pid)
