"""Datasheet peaks, JSON-lines logs, TensorBoard events and the heartbeating status file.

Free of jax: the CLI writes the status file before the heavy imports. The measured peak (for
devices without a datasheet entry) lives in trainer.peak.
"""

from __future__ import annotations

import contextlib
import threading
import time

from contract.status import JobState
from trainer import events, storage
from trainer.status import StatusFile

# Dense bf16 peak FLOP/s per chip (vendor datasheets).
PEAK_FLOPS = {
    "v4": 275e12,
    "v5e": 197e12,
    "v5p": 459e12,
    "v6e": 918e12,
    "h100": 989e12,
    "h200": 989e12,
}


def generation(device) -> str | None:
    """Maps jax's device_kind ("TPU v5 lite", "NVIDIA H100 80GB HBM3", ...) to a table key."""
    kind = device.device_kind.lower()
    for needle, gen in (
        ("v6", "v6e"),
        ("v5 lite", "v5e"),
        ("v5e", "v5e"),
        ("v5", "v5p"),
        ("v4", "v4"),
        ("h100", "h100"),
        ("h200", "h200"),
    ):
        if needle in kind:
            return gen
    return None


# States that beat however long they last: a restore of a large checkpoint and a first compile
# take minutes, bounded by the watcher's startup limit instead of the stall rule.
_BEATS_WHILE = (JobState.INITIALIZING, JobState.RESTORING, JobState.COMPILING)


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
            waiting = self._file.status.state in _BEATS_WHILE
            if not waiting and time.time() - self._progress > self._stall:
                continue
            with self._lock, contextlib.suppress(OSError):
                self._file.update()

    def stop(self) -> None:
        self._stop.set()


class MetricsLog:
    """JSON lines on stdout (process 0 only) and TensorBoard events under `<workdir>/tb`."""

    def __init__(self, workdir: str, enabled: bool):
        self.enabled = enabled
        self._tb = None
        if enabled:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(storage.join(workdir, "tb"), flush_secs=10)
            except Exception as e:  # noqa: BLE001 - metrics must never kill training
                self.event("tensorboard_disabled", reason=str(e)[:200])

    def event(self, name: str, **fields) -> None:
        if self.enabled:
            events.event(name, **fields)

    def scalars(self, step: int, values: dict) -> None:
        if not self.enabled:
            return
        events.write({"step": step, "time": events.now(), **values})
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, int | float):
                    self._tb.add_scalar(f"train/{key}", value, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
