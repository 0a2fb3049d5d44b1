"""What the watcher learns from the workers' status between incidents: the slice's progress age
(the judge's hang rule), the newest step and committed checkpoint (the failure streak), the
checkpoints a job set aside, and when a recovered job counts as resumed."""

from __future__ import annotations

import time

from contract.status import RESUMED_STATES
from ops.fleet.job_status import JobRules
from ops.fleet.probe import Probe
from ops.watch.incident import Incident, WatchState
from ops.watch.journal import Journal
from ops.watch.step_clock import StepClock

# The run's newest step goes to the journal at most this often (one bucket write each): the
# samples `tpupod goodput` takes its step time from (ops.watch.goodput).
PROGRESS_EVERY_S = 60.0
LOOK_MARGIN_S = 0.02  # past the limit by this when the early probe reads the files


class Progress:
    def __init__(self, state: WatchState, journal: Journal, rules: JobRules,
                 every: float = PROGRESS_EVERY_S, clock: StepClock | None = None):  # fmt: skip
        self.state, self.journal, self.rules = state, journal, rules
        self.clock = clock  # the step clock (hang detection), if the watch keeps one
        self.every, self._said = every, (0.0, -1)  # (when, step) of the last `progress` event
        self._marks: dict[int, tuple] = {}  # worker -> ((state, step, pid), when it last changed)
        self._fallbacks_seen: set[tuple[int, int | None]] = set()
        self._looked = 0.0  # the last track: a change seen now was written after it
        self._expires: float | None = None  # when the step clock's limit runs out, if it keeps one

    def track(self, probes: list[Probe], now: float | None = None) -> None:
        """Progress is the slice's: the age of the newest change of any worker's (state, step)
        (often only process 0 reports, and one stalled worker stalls them all), and the step
        clock's limit from the slice's newest step."""
        st, now = self.state, time.time() if now is None else now
        ages, changed = [], []
        for p in probes:
            s = p.current(st.since)
            mark = (s.state, s.step, s.pid) if s else None
            last = self._marks.get(p.index)
            if last is None or last[0] != mark:
                when = now if last is None else self._written(p, s, now)
                self._marks[p.index] = last = (mark, when)
                changed.append(when)
            if s is not None:
                ages.append(now - last[1])
        limit = self._clock(probes, max(changed, default=now))
        self._looked = now
        self._expires = now - min(ages) + limit if limit is not None and ages else None
        for p in probes:
            p.progress_age, p.step_limit = min(ages, default=0.0), limit
            if p.attempt is not None:
                st.attempt = max(st.attempt, p.attempt)
            if (s := p.current(st.since)) is not None:
                st.last_step = max(st.last_step, s.step)
                self.committed(s.last_checkpoint, s.local_checkpoint)
        self._journal_fallbacks(probes)
        self._journal_progress(now)
        if st.incident is not None and not st.incident.phases:
            st.incident.step = max(st.incident.step, st.last_step)  # steps until it died

    def next_look(self, now: float, poll: float) -> float:
        """Seconds until the next probe: `poll`, or less when the step clock's limit runs out
        sooner, so that a hang is seen as its limit passes rather than up to a poll (and a
        probe) later. A limit already past (a save, an eval: the judge allows those more) waits
        the poll as before."""
        left = None if self._expires is None else self._expires - now
        return left + LOOK_MARGIN_S if left is not None and 0 < left < poll else poll

    def _written(self, p: Probe, s, now: float) -> float:
        """When a change the watcher sees now was written, on the watcher's clock: the file's
        age by the worker's own clock (the probe's `now` less the writer's `updated`: no clock
        skew between hosts), back from now, but never before the last look (a change seen now
        came after it). Late rather than early: the newest write may be a beat after the change
        itself. It takes a poll's lag off a hang's detection."""
        if s is None or not p.now or not s.updated:
            return now
        return max(self._looked, now - max(0.0, p.now - s.updated))

    def _clock(self, probes: list[Probe], now: float) -> float | None:
        if self.clock is None:
            return None
        steps = [s.step for p in probes if (s := p.current(self.state.since))]
        self.clock.observe(max(steps, default=None), now, self.state.since)
        return self.clock.limit()

    def committed(self, step: int | None, local: int | None = None) -> None:
        """A committed step newer than any seen before is progress: it ends a streak of failure
        restarts (`committed` only grows, so it is newer than the last failure's too). So does a
        newer step in the local tier (what a restart on the same VMs restores): a job that keeps
        failing at the same step never writes a newer one, and its waits still grow."""
        st = self.state
        if step is not None and (st.committed is None or step > st.committed):
            st.committed, st.streak = step, 0
        if local is not None and (st.local_committed is None or local > st.local_committed):
            st.local_committed, st.streak = local, 0

    def _journal_progress(self, now: float) -> None:
        """A sample of the run's newest step, outside incidents, at most every `every` s."""
        st, (said_at, said_step) = self.state, self._said
        if (st.incident is not None and st.incident.open) or st.last_step == said_step:
            return
        if now - said_at >= self.every:
            self.journal.event("progress", f"step {st.last_step}", step=st.last_step)
            self._said = (now, st.last_step)

    def _journal_fallbacks(self, probes: list[Probe]) -> None:
        """A job that restored past an unreadable checkpoint lists the steps it set aside in its
        status (`fallbacks`, trainer/train.py); journaled once per job process."""
        for p in probes:
            s = p.status
            if s is None or not s.fallbacks or (p.index, s.pid) in self._fallbacks_seen:
                continue
            self._fallbacks_seen.add((p.index, s.pid))
            lines = "; ".join(str(f.get("line", f)) for f in s.fallbacks)
            self.journal.event("checkpoint_fallback", f"worker {p.index}: {lines}",
                                 worker=p.index, restored=s.restored_from,
                                 set_aside=[f.get("step") for f in s.fallbacks])  # fmt: skip

    def resumed(self, probes: list[Probe]) -> bool:
        """Every worker's job runs (or ran to its end) and, for a job that reports progress,
        the slice reports a step again."""
        since = self.state.since
        if not all(p.alive or p.current(since) for p in probes):
            return False
        fresh = [p.current(since) for p in probes if p.current(since)]
        if not self.rules.reports_progress:
            return True
        return bool(fresh) and all(s.state in RESUMED_STATES for s in fresh)

    def close_incident(self, inc: Incident, probes: list[Probe]) -> None:
        """Journal `resumed`: the step it resumed from is what the job reports it restored (the
        built-in trainer and tpupod_job do), else the first step seen after the restart, less
        one (a job that prints its steps: an upper bound)."""
        fresh = [s for p in probes if (s := p.current(self.state.since))]
        reported = [s.restored_from for s in fresh if s.restored_from is not None]
        restored = (
            min(reported) if reported else max(0, min((s.step for s in fresh), default=1) - 1)
        )
        tiers = {s.restored_tier for s in fresh if s.restored_from is not None}
        tier = tiers.pop() if len(tiers) == 1 else None  # every process read the same tier
        inc.phases["resumed"] = now = time.time()
        lost = max(0, inc.step - restored)
        self.state.last_step = restored
        self.journal.event(
            "resumed",
            f"resumed at step {restored}{f' ({tier} tier)' if tier else ''} after {inc.kind}: "
            f"{lost} steps lost, "
            f"{now - inc.detected_at:.1f}s since detection",
            kind=inc.kind,
            step=restored,
            steps_lost=lost,
            tier=tier,
            detected_at=inc.detected_at,
            recovery_s=now - inc.detected_at,
            phases={k: v - inc.detected_at for k, v in inc.phases.items()},
        )
