"""Fault schedules for benchmark runs: called by `ops.watch.Watcher` at every poll (`on_poll`).

A fault is injected only while the job is healthy (no incident being recovered, every worker
training with a fresh heartbeat), so each event is one clean incident. The injection time is taken
just before the call into the pod and goes to the journal as `injected` (kind, notice, step).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from localpod import faults
from localpod.faults import KILLS_WATCH, ONLY_WHILE_SAVING
from ops.watch.transitions import Phase


class WatchKilled(Exception):
    """Raised from on_poll mid-recovery: the watch ends as a killed process would, without
    persisting its last step; the benchmark starts a new one on the same incident.json."""


class Stop(Exception):
    """Raised from on_poll to end a run that needs no `done` (the recovery benchmark)."""


def healthy(watcher, probes) -> int | None:
    """The slowest reporting worker's step when every worker's job runs and every report is
    current and stepping (often only process 0 reports), else None."""
    if watcher.state.incident is not None and "resumed" not in watcher.state.incident.phases:
        return None
    fresh = [s for p in probes if (s := p.current(watcher.state.since))]
    if not probes or not fresh or not all(p.alive for p in probes):
        return None
    if any(s.state not in ("training", "saving") for s in fresh):
        return None
    return min(s.step for s in fresh)


def saving(probes, every: int | None = None) -> bool:
    """Some worker's job is in a save right now, as this poll saw it: its status says `saving`
    (a save on the loop), or, with the bucket's saves every `every` steps, the newest save point
    it passed is newer than its last committed step: a periodic save a thread still writes (the
    loop's own part of it lasts milliseconds, which a poll a second apart all but never saw; a
    save-kill then waited minutes while the campaign's job ran out). The status's committed step
    is as fresh as its last report, so such a kill may land just after the commit."""
    for probe in probes:
        s = probe.status
        if s is None:
            continue
        if s.state == "saving":
            return True
        point = s.step - s.step % every if every else 0
        if point > 0 and s.state == "training" and (s.last_checkpoint or -1) < point:
            return True
    return False


@dataclass
class Schedule:
    """Injects `kinds` in order. The next fault is due `period` s after the previous one (or after
    the first healthy poll), and no sooner than `min_steps` steps after the job last resumed.
    With `stop_steps`, the run ends (Stop) that many steps after the last fault's recovery."""

    pod: object
    kinds: Sequence[str]
    period: float = 0.0
    min_steps: int = 0
    notice: float = 30.0
    stop_steps: int | None = None
    cycle: bool = False  # repeat `kinds` until the job is done
    # No fault at or past this step: a fault needs steps after it to show its recovery (a
    # restore-kill injected at a run's last step resumed there, the run was done, and it was
    # counted as not recovered: 2026-12-05's campaign).
    end_step: int | None = None
    save_every: int | None = None  # the bucket's interval: a save in flight counts as saving
    # Before the first fault: e.g. the job's environment published (what hours of a real run
    # have done by their first preemption), so every fault meets the steady state.
    ready: Callable[[], bool] | None = None
    injected: list[dict] = field(default_factory=list)
    _start: float | None = None  # the first healthy poll
    _healthy_step: int = 0  # the step at the first healthy poll after the last fault
    _armed: int = -1  # len(injected) when _healthy_step was taken
    _kill_watch_in: int | None = None  # mid-recovery polls left before the watch dies
    _waited: int = -1  # len(injected) when the next fault was last journaled as waiting

    def next_kind(self) -> str | None:
        n = len(self.injected)
        if self.cycle:
            return self.kinds[n % len(self.kinds)]
        return self.kinds[n] if n < len(self.kinds) else None

    def __call__(self, watcher, probes) -> None:
        self._maybe_kill_watch(watcher)
        step = healthy(watcher, probes)
        if step is None or (not self.injected and self.ready is not None and not self.ready()):
            return
        now = time.time()
        if self._start is None:
            self._start = now
        if self._armed != len(self.injected):
            self._armed, self._healthy_step = len(self.injected), step
        kind = self.next_kind()
        if kind is None:
            if self.stop_steps is not None and step - self._healthy_step >= self.stop_steps:
                raise Stop(f"{len(self.injected)} faults recovered")
            return
        last = self.injected[-1]["time"] if self.injected else self._start
        if now - last < self.period or step - self._healthy_step < self.min_steps:
            return
        if self.end_step is not None and step >= self.end_step:
            return
        if kind in ONLY_WHILE_SAVING and not saving(probes, self.save_every):
            return
        if (missing := faults.lacks(self.pod, kind)) is not None:
            self._waiting(watcher, kind, step, missing)
            return
        self.inject(watcher, kind, step)

    def _waiting(self, watcher, kind: str, step: int, missing: str) -> None:
        """Journals once per fault that it waits for the pod (FaultKind.lacks)."""
        if self._waited != len(self.injected):
            self._waited = len(self.injected)
            watcher.journal.event(
                "fault_waiting", f"{kind} waits at step ~{step} for {missing}",
                fault=kind, step=step,
            )  # fmt: skip

    def _maybe_kill_watch(self, watcher) -> None:
        """Kills the watch on the n-th poll of a recovery under way (n cycles 1..3 over the
        campaign's watch kills, so they land at different points of the delete and create)."""
        inc = watcher.state.incident
        if self._kill_watch_in is None or inc is None or not inc.open:
            return
        if inc.phase in (Phase.WATCHING, Phase.PENDING_RECREATE):
            return
        self._kill_watch_in -= 1
        if self._kill_watch_in <= 0:
            self._kill_watch_in = None
            raise WatchKilled(f"watch killed during {inc.phase}")

    def inject(self, watcher, kind: str, step: int) -> None:
        started = time.time()
        notice = self.notice if kind == "notice" else 0.0  # every other kind is without notice
        faults.kind_of(kind)  # an unknown kind is a mistake in the schedule, not a deferral
        try:
            done = faults.inject(self.pod, kind, notice)
        except Exception as err:  # noqa: BLE001 - the slice moved on; try again next poll
            watcher.journal.event("error", f"fault injection deferred: {err}")
            return
        record = {"time": started, "kind": kind, "notice": notice, "step": step}
        if isinstance(done, dict):  # what the fault did besides (damaged-newest: the step)
            record.update(done)
        if kind in KILLS_WATCH:
            self._kill_watch_in = 1 + sum(f["kind"] in KILLS_WATCH for f in self.injected) % 3
        self.injected.append(record)
        watcher.journal.event(
            "injected",
            f"{faults.describe(kind, notice)} at step ~{step}",
            fault=kind,
            injected_at=started,
            notice=notice,
            step=step,
        )
