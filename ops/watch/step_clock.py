"""Hangs told by the step clock: a job that steps every few seconds and then stops is hung long
before a fixed stall limit says so. The clock keeps the seconds between the slice's recent step
advances (as the job reports them: the built-in trainer every `log_every` steps, a helper job
every step) and allows `factor` times their median, never less than `floor` (a poll, a slow
probe) and never more than the stall limit it sharpens (ops.watch.conditions applies it only
while the job says it is training: a save, an eval or a compile has its own allowance).

It trusts itself only after MIN_GAPS advances of the current job (a restart starts it afresh):
the first steps after a start include compilation, which the startup allowance covers."""

from __future__ import annotations

import statistics
from collections import deque

MIN_GAPS = 3  # advances of the current job before its clock is trusted
RECENT = 20  # the gaps the median is taken over


class StepClock:
    def __init__(self, factor: float, floor: float):
        self.factor, self.floor = factor, floor
        self._gaps: deque[float] = deque(maxlen=RECENT)
        self._last: tuple[int, float] | None = None  # (step, when it was first seen)
        self._since: float | None = None  # the job start the gaps belong to

    def observe(self, step: int | None, now: float, since: float) -> None:
        """The slice's newest reported step at `now`, for the job started at `since`."""
        if since != self._since:
            self._gaps.clear()
            self._last, self._since = None, since
        if step is None:
            return
        if self._last is None or step < self._last[0]:  # a restart (tpupod restart, rollout)
            self._gaps.clear()
            self._last = (step, now)
        elif step > self._last[0]:
            self._gaps.append(now - self._last[1])
            self._last = (step, now)

    def limit(self) -> float | None:
        """Seconds without a new step that mean a hang; None until the clock is trusted."""
        if len(self._gaps) < MIN_GAPS:
            return None
        return max(self.floor, self.factor * statistics.median(self._gaps))
