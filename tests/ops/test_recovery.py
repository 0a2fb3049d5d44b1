"""The recovery state table, row by row: no I/O, no clock."""

from __future__ import annotations

import pytest

from ops.job_status import JobRules, JobStatus
from ops.probe import Probe
from ops.provider import SliceState
from ops.recovery import (
    SLICE_ACTIONS,
    Action,
    Limits,
    SliceAction,
    WorkerCondition,
    backoff,
    decide,
    judge_worker,
)

NOW = 10_000.0
SINCE = 9_000.0
LIMITS = Limits(hang=30, start=300, stall=100, bootstrap=600, ssh=60, preempt_grace=20)
OK = {"state": "ok", "phase": "start-job"}
RULES = JobRules()  # the defaults: 75 preempted, 2 fatal, no steps declared


def never(_key):
    return 0.0


def forever(_key):
    return 1e9


def probe(index=0, state="training", age=1.0, step=10, beat=True, **kw) -> Probe:
    """A worker whose status was written `age` s ago; `beat`: with the built-in trainer's
    heartbeat (a thread's), else as tpupod_job.progress() writes it (at steps only)."""
    status = JobStatus(step=step, state=state, updated=NOW - age,
                       heartbeat=NOW - age if beat else None)  # fmt: skip
    return Probe(index, bootstrap=kw.pop("bootstrap", OK), status=status, now=NOW, **kw)


def judge(p: Probe, rules: JobRules = RULES, **kw) -> WorkerCondition:
    return judge_worker(p, SINCE, LIMITS, rules, **kw).condition


def test_every_slice_state_has_a_row():
    assert set(SLICE_ACTIONS) == set(SliceState)


@pytest.mark.parametrize(
    ("state", "action"),
    [
        (SliceState.CREATING, Action.WAIT),
        (SliceState.READY, Action.WAIT),  # healthy workers: keep watching
        (SliceState.RESTARTING, Action.WAIT),
        (SliceState.REPAIRING, Action.WAIT),
        (SliceState.STOPPING, Action.WAIT),
        (SliceState.STOPPED, Action.RECREATE),
        (SliceState.STARTING, Action.WAIT),
        (SliceState.PREEMPTED, Action.RECREATE),
        (SliceState.TERMINATED, Action.RECREATE),
        (SliceState.DELETING, Action.WAIT),
        (SliceState.MISSING, Action.RECREATE),
        (SliceState.UNKNOWN, Action.WAIT),
    ],
)
def test_slice_state_to_action(state, action):
    assert decide(state, [probe(0), probe(1)], SINCE, never, LIMITS).action is action


@pytest.mark.parametrize("state", [s for s, a in SLICE_ACTIONS.items() if a is SliceAction.WAIT])
def test_a_transition_stuck_past_its_deadline_is_recreated(state):
    assert decide(state, [], SINCE, forever, LIMITS).action is Action.RECREATE


@pytest.mark.parametrize(
    ("p", "condition"),
    [
        (Probe(0, reachable=False, error="refused"), WorkerCondition.UNREACHABLE),
        (Probe(0, bootstrap=None, now=NOW), WorkerCondition.BOOTSTRAPPING),
        (Probe(0, bootstrap={"state": "running"}, now=NOW), WorkerCondition.BOOTSTRAPPING),
        (Probe(0, bootstrap={"state": "failed"}, now=NOW), WorkerCondition.BOOTSTRAP_FAILED),
        (Probe(0, bootstrap=OK, now=NOW), WorkerCondition.STARTING),
        (probe(age=NOW - SINCE + 5), WorkerCondition.STARTING),  # status of the previous run
        (probe(), WorkerCondition.RUNNING),
        (probe(age=31), WorkerCondition.HUNG),
        # the heartbeat comes from a thread: frozen in any state is a hang
        (probe(state="compiling", age=10), WorkerCondition.RUNNING),
        (probe(state="compiling", age=31), WorkerCondition.HUNG),
        (probe(state="saving", age=31), WorkerCondition.HUNG),
        (probe(alive=False), WorkerCondition.FAILED),
        (probe(state="failed"), WorkerCondition.FAILED),
        (probe(state="done"), WorkerCondition.DONE),
        (probe(state="preempted"), WorkerCondition.PREEMPTED),
        (probe(preempted_flag=True), WorkerCondition.PREEMPTED),
        (probe(exit_code=1, exit_mtime=NOW, alive=False), WorkerCondition.FAILED),
        (probe(exit_code=137, exit_mtime=NOW, alive=False), WorkerCondition.FAILED),
        (probe(exit_code=75, exit_mtime=NOW, alive=False), WorkerCondition.PREEMPTED),
        (probe(exit_code=0, exit_mtime=NOW, alive=False), WorkerCondition.DONE),
        (probe(exit_code=1, exit_mtime=SINCE - 1), WorkerCondition.RUNNING),  # stale exit file
        (probe(exit_code=2, exit_mtime=NOW, alive=False), WorkerCondition.FATAL),
        # exit 0 after a SIGTERM to the job's group, or under a preemption notice: not done
        (
            probe(exit_code=0, exit_mtime=NOW, alive=False, term_at=NOW - 3),
            WorkerCondition.PREEMPTED,
        ),
        (
            probe(exit_code=0, exit_mtime=NOW, alive=False, preempted_flag=True),
            WorkerCondition.PREEMPTED,
        ),  # fmt: skip
        (probe(exit_code=0, exit_mtime=NOW, alive=False, term_at=SINCE - 1), WorkerCondition.DONE),
        (
            probe(exit_code=2, exit_mtime=NOW, alive=False, term_at=NOW - 3),
            WorkerCondition.PREEMPTED,
        ),
        # no heartbeat (a job's own status file): judged by the slice's progress alone
        (probe(age=200, beat=False), WorkerCondition.RUNNING),
        (probe(age=200, beat=False, progress_age=101), WorkerCondition.HUNG),
    ],
)
def test_worker_condition(p, condition):
    assert judge(p) is condition


@pytest.mark.parametrize(
    ("code", "rules", "condition"),
    [
        (75, JobRules(preempted=frozenset(), fatal=frozenset({3})), WorkerCondition.FAILED),
        (3, JobRules(preempted=frozenset(), fatal=frozenset({3})), WorkerCondition.FATAL),
        (2, JobRules(preempted=frozenset(), fatal=frozenset({3})), WorkerCondition.FAILED),
        (42, JobRules(preempted=frozenset({42})), WorkerCondition.PREEMPTED),
    ],
)
def test_a_jobs_own_exit_codes(code, rules, condition):
    assert judge(probe(exit_code=code, exit_mtime=NOW, alive=False), rules) is condition


def test_a_worker_that_reports_nothing_is_watched_by_liveness():
    silent = Probe(1, bootstrap=OK, alive=True, now=NOW)
    assert judge(silent) is WorkerCondition.STARTING  # nobody reports yet: starting
    assert judge(silent, slice_reports=True) is WorkerCondition.RUNNING  # process 0 does
    no_progress = JobRules(reports_progress=False)
    assert judge(silent, no_progress) is WorkerCondition.RUNNING
    silent.alive = False
    assert judge(silent, no_progress) is WorkerCondition.FAILED


@pytest.mark.parametrize(
    ("probes", "waited", "action", "condition"),
    [
        ([probe(0), probe(1)], never, Action.WAIT, WorkerCondition.RUNNING),
        ([probe(0), probe(1, alive=False)], never, Action.RESTART, WorkerCondition.FAILED),
        ([probe(0), probe(1, age=99)], never, Action.RESTART, WorkerCondition.HUNG),
        # a crash outranks a preemption notice elsewhere
        (
            [probe(0, state="preempted"), probe(1, state="failed")],
            never,
            Action.RESTART,
            WorkerCondition.FAILED,
        ),
        ([probe(0, state="preempted"), probe(1)], never, Action.WAIT, None),
        ([probe(0, state="preempted")], forever, Action.RESUME, None),
        ([probe(0, state="done"), probe(1)], never, Action.WAIT, None),
        (
            [probe(0, state="done"), probe(1, state="done")],
            never,
            Action.FINISH,
            WorkerCondition.DONE,
        ),
        ([Probe(0, reachable=False, error="x")], never, Action.WAIT, None),
        ([Probe(0, reachable=False, error="x")], forever, Action.REBUILD, None),
        ([Probe(0, bootstrap={"state": "failed"})], never, Action.REBUILD, None),
        ([Probe(0, bootstrap={"state": "running"})], forever, Action.REBUILD, None),
        ([Probe(0, bootstrap=OK, now=NOW)], forever, Action.RESTART, None),
        (
            [probe(0, exit_code=2, exit_mtime=NOW, alive=False), probe(1, alive=False)],
            never,
            Action.STOP,
            WorkerCondition.FATAL,
        ),
        # only process 0 reports: the other is judged alive by its process
        ([probe(0), Probe(1, bootstrap=OK, alive=True, now=NOW)], never, Action.WAIT, None),
    ],
)
def test_slice_wide_decision(probes, waited, action, condition):
    decision = decide(SliceState.READY, probes, SINCE, waited, LIMITS, rules=RULES)
    assert decision.action is action
    if condition is not None:
        assert decision.condition is condition


def done(index: int, step: int) -> Probe:
    return probe(index, step=step, exit_code=0, exit_mtime=NOW, alive=False)


def test_done_needs_every_worker_at_the_declared_steps():
    rules = JobRules(steps=20)
    early = decide(SliceState.READY, [done(0, 12), done(1, 12)], SINCE, never, LIMITS, rules=rules)
    assert (early.action, early.condition) == (Action.RESTART, WorkerCondition.FAILED)
    assert "before its 20 steps" in early.reason
    last = decide(SliceState.READY, [done(0, 20), done(1, 20)], SINCE, never, LIMITS, rules=rules)
    assert last.action is Action.FINISH
    # An attempt that restored the last step and exited at once reports no step of its own:
    # the run's newest step decides.
    quiet = [
        probe(i, exit_code=0, exit_mtime=NOW, alive=False, age=NOW - SINCE + 5) for i in (0, 1)
    ]
    for run_step, action in ((20, Action.FINISH), (12, Action.RESTART), (None, Action.RESTART)):
        got = decide(SliceState.READY, quiet, SINCE, never, LIMITS, rules=rules, run_step=run_step)
        assert got.action is action, (run_step, got)
    silent = JobRules(steps=20, reports_progress=False)  # no progress: exit 0 everywhere is done
    assert decide(SliceState.READY, [done(0, 3)], SINCE, never, LIMITS, rules=silent).action is (
        Action.FINISH
    )


def test_maintenance_health_is_a_preemption_notice():
    d = decide(SliceState.READY, [probe()], SINCE, never, LIMITS, "UNHEALTHY_MAINTENANCE")
    assert (d.action, d.condition) == (Action.WAIT, WorkerCondition.PREEMPTED)
    d = decide(SliceState.READY, [probe()], SINCE, forever, LIMITS, "UNHEALTHY_MAINTENANCE")
    assert d.action is Action.RESUME


def test_backoff_grows_and_is_capped():
    assert [backoff(n, 1.0, 5.0) for n in range(5)] == [0.0, 1.0, 2.0, 4.0, 5.0]


def test_a_trainer_without_progress_is_hung_even_with_a_fresh_heartbeat():
    stuck = probe(state="saving", age=1, progress_age=LIMITS.stall + 1)
    assert judge(stuck) is WorkerCondition.HUNG
    compiling = probe(state="compiling", age=1, progress_age=200)  # < start
    assert judge(compiling) is WorkerCondition.RUNNING
    compiling.progress_age = 301
    assert judge(compiling) is WorkerCondition.HUNG
