"""Hangs told by the step clock (issue 50, item 2): a job that stepped every ~0.5 s and stops is
hung after max(floor, 10 x its median gap), not after the stall limit; a slow step, a save and
a fresh start are not hangs (the negative controls)."""

from __future__ import annotations

from contract.status import JobStatus
from ops.fleet.job_status import JobRules
from ops.fleet.probe import Probe
from ops.watch.conditions import WorkerCondition, judge_worker
from ops.watch.deadlines import Limits, config_for
from ops.watch.incident import WatchState
from ops.watch.journal import Journal
from ops.watch.progress import LOOK_MARGIN_S, Progress
from ops.watch.step_clock import StepClock

LIMITS = Limits(hang=30, start=300, stall=100)
SINCE = 1000.0


def stepping(clock: StepClock, gaps: list[float], start: float = SINCE) -> float:
    """Steps 1, 2, ... reported `gaps` seconds apart; the time of the last one."""
    now, step = start, 0
    clock.observe(step, now, SINCE)
    for gap in gaps:
        now, step = now + gap, step + 1
        clock.observe(step, now, SINCE)
    return now


def test_the_limit_is_a_multiple_of_the_median_gap_with_a_floor():
    clock = StepClock(10.0, 3.0)
    stepping(clock, [0.5, 0.5])
    assert clock.limit() is None  # two gaps: not trusted yet (the first include compilation)
    stepping(clock, [0.5, 0.5, 0.5, 9.0])  # one long gap (a save) does not move the median
    assert clock.limit() == 5.0
    fast = StepClock(10.0, 3.0)
    stepping(fast, [0.1] * 5)
    assert fast.limit() == 3.0  # the floor


def test_a_restart_starts_the_clock_afresh():
    clock = StepClock(10.0, 3.0)
    stepping(clock, [0.5] * 5)
    clock.observe(3, 2000.0, SINCE + 500)  # the job started again (watch's since moved)
    assert clock.limit() is None


def status_probe(step: int, state: str, now: float) -> Probe:
    return Probe(0, bootstrap={"state": "ok"}, now=now, alive=True,
                 status=JobStatus(step=step, state=state, updated=now, heartbeat=now))  # fmt: skip


def judged_after(silence: float, state: str = "training", gaps=(0.5,) * 6,
                 limits: Limits = LIMITS, floor: float = 3.0) -> WorkerCondition:  # fmt: skip
    """The job steps `gaps` apart through Progress (as the watcher tracks it), then reports
    nothing new for `silence` seconds while saying `state`."""
    progress = Progress(WatchState(since=SINCE), Journal(None), JobRules(),
                        clock=StepClock(limits.step_clock, floor))  # fmt: skip
    now, step = SINCE, 0
    for gap in gaps:
        now, step = now + gap, step + 1
        progress.track([status_probe(step, "training", now)], now=now)
    quiet = status_probe(step, state, now)
    progress.track([quiet], now=now)
    later = status_probe(step, state, now)
    later.now = now + silence
    progress.track([later], now=now + silence)
    return judge_worker(later, SINCE, limits, JobRules(), False).condition


def test_a_job_that_stops_stepping_is_hung_by_the_clock_long_before_the_stall_limit():
    assert judged_after(6.0) is WorkerCondition.HUNG  # 10 x 0.5 s = 5 s; the stall limit: 100 s
    assert judged_after(4.0) is WorkerCondition.RUNNING


def test_a_slow_job_a_save_and_no_clock_are_not_hangs():
    """Negative controls: the same silence is no hang for a job whose steps take 2 s, for a
    job that says it is saving (its stall limit applies), or before the clock is trusted."""
    assert judged_after(6.0, gaps=(2.0,) * 6) is WorkerCondition.RUNNING
    assert judged_after(6.0, state="saving") is WorkerCondition.RUNNING
    assert judged_after(6.0, gaps=(0.5, 0.5)) is WorkerCondition.RUNNING


def test_a_job_that_reports_steps_alone_keeps_the_stall_limit():
    """Negative control: a writer without a heartbeat (tpupod_job.progress, a progress regex)
    cannot say it is saving or evaluating, so its pauses keep the stall limit."""
    probe = Probe(0, bootstrap={"state": "ok"}, now=SINCE + 10, alive=True,
                  status=JobStatus(step=5, state="training", updated=SINCE))  # fmt: skip
    probe.progress_age, probe.step_limit = 10.0, 3.0
    assert judge_worker(probe, SINCE, LIMITS, JobRules(), False).condition is (
        WorkerCondition.RUNNING
    )
    probe.status.heartbeat = SINCE + 10
    assert judge_worker(probe, SINCE, LIMITS, JobRules(), False).condition is WorkerCondition.HUNG


def test_a_step_going_backwards_starts_the_clock_afresh():
    clock = StepClock(10.0, 3.0)
    now = stepping(clock, [0.5] * 5)
    clock.observe(2, now + 1, SINCE)  # `tpupod restart`: the job resumed from an older step
    assert clock.limit() is None


def test_the_local_pod_tells_a_hang_about_two_seconds_after_the_jobs_normal_gap():
    """The profiles (ops.watch.deadlines): on the local pod `tiny`'s steps are seen at every poll
    (~0.6 s apart) and a hang is told ~2 s later; GCP's clock waits its 60 s floor. Negative
    controls: the local pod's shorter silence, and a job whose steps are 1.5 s apart."""
    local = config_for("local").limits
    gcp = config_for("gcp").limits
    tiny = (0.6,) * 8

    def judged(silence: float, limits: Limits, gaps=tiny) -> WorkerCondition:
        return judged_after(silence, gaps=gaps, limits=limits, floor=limits.step_floor)

    assert judged(2.5, local) is WorkerCondition.HUNG  # 3 x 0.6 s = 1.8 s: the 2 s floor
    assert judged(1.5, local) is WorkerCondition.RUNNING
    assert judged(2.5, gcp) is WorkerCondition.RUNNING and judged(61, gcp) is WorkerCondition.HUNG
    assert judged(2.5, local, gaps=(1.5,) * 8) is WorkerCondition.RUNNING  # 3 x 1.5 s = 4.5 s
    assert judged(5.0, local, gaps=(1.5,) * 8) is WorkerCondition.HUNG


def test_a_change_is_dated_when_its_worker_wrote_it_never_before_the_last_look():
    """The watcher sees a step a poll after it was written: the change is dated by the worker's
    own clock (the probe's `now` less the file's `updated`), so a hang is told a poll's lag
    sooner; a file older than the last look is dated at that look. Control: a file written just
    as it was probed ages from the probe, as before."""

    def age_after(written_ago: float, poll: float = 0.5, skew: float = 1e6) -> float:
        progress = Progress(WatchState(since=SINCE), Journal(None), JobRules())
        first = status_probe(1, "training", SINCE + 1)
        progress.track([first], now=SINCE + 1)
        seen = SINCE + 1 + poll  # the next poll; the worker's clock is `skew` s off the watcher's
        probe = status_probe(2, "training", seen + skew)
        probe.status.updated = probe.status.heartbeat = seen + skew - written_ago
        progress.track([probe], now=seen)
        later = status_probe(2, "training", seen + skew + 1.0)
        progress.track([later], now=seen + 1.0)
        return later.progress_age

    assert abs(age_after(0.4) - 1.4) < 1e-6  # written 0.4 s before the poll that saw it
    assert abs(age_after(5.0) - 1.5) < 1e-6  # older than the last look: dated at that look
    assert abs(age_after(0.0) - 1.0) < 1e-6  # the control: no lag to take off


def test_the_next_look_comes_as_the_step_clocks_limit_runs_out():
    """The watcher probes as the clock's limit passes, not up to a poll later, and that probe
    tells the hang. Negative controls: a limit far off, one already past (a save: the judge
    allows it more) and a watch without a clock wait the poll."""
    limits = config_for("local").limits
    progress = Progress(WatchState(since=SINCE), Journal(None), JobRules(),
                        clock=StepClock(limits.step_clock, limits.step_floor))  # fmt: skip
    now = SINCE
    for step in range(1, 8):
        now += 0.3
        progress.track([status_probe(step, "training", now)], now=now)
    last = now  # 3 x 0.3 s < the 2 s floor: the limit runs out at last + 2
    assert progress.next_look(last, 0.5) == 0.5
    look = last + 1.7
    progress.track([status_probe(7, "training", look)], now=look)  # nothing new
    pause = progress.next_look(look, 0.5)
    assert abs(pause - (0.3 + LOOK_MARGIN_S)) < 1e-9
    early = status_probe(7, "training", look + pause)
    progress.track([early], now=look + pause)
    assert judge_worker(early, SINCE, limits, JobRules(), False).condition is WorkerCondition.HUNG
    assert progress.next_look(look + pause, 0.5) == 0.5  # already past
    plain = Progress(WatchState(since=SINCE), Journal(None), JobRules())
    plain.track([status_probe(1, "training", SINCE)], now=SINCE)
    assert plain.next_look(SINCE + 1.9, 0.5) == 0.5
