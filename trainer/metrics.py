"""The run's metrics: JSON lines on stdout and TensorBoard events under the workdir (the status
file and its heartbeat: trainer.status; the peaks MFU is measured against: trainer.peak)."""

from __future__ import annotations

from trainer import events, storage


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
