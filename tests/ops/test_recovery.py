"""The recovery state table, row by row: no I/O, no clock."""

from __future__ import annotations

import pytest

from ops.provider import SliceState
from ops.recovery import (
    SLICE_ACTIONS,
    Action,
    Limits,
    Probe,
    SliceAction,
    WorkerCondition,
    backoff,
    decide,
    judge_worker,
)
from trainer.status import TrainerState, TrainerStatus

NOW = 10_000.0
SINCE = 9_000.0
LIMITS = Limits(hang=30, start=300, stall=100, bootstrap=600, ssh=60, preempt_grace=20)
OK = {"state": "ok", "phase": "trainer"}


def never(_key):
    return 0.0


def forever(_key):
    return 1e9


def probe(index=0, state=TrainerState.TRAINING, age=1.0, step=10, **kw) -> Probe:
    status = TrainerStatus(state=state, step=step, heartbeat=NOW - age, process_id=index)
    return Probe(index, bootstrap=kw.pop("bootstrap", OK), status=status, now=NOW, **kw)


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
        (probe(state=TrainerState.COMPILING, age=10), WorkerCondition.RUNNING),
        (probe(state=TrainerState.COMPILING, age=31), WorkerCondition.HUNG),
        (probe(state=TrainerState.SAVING, age=31), WorkerCondition.HUNG),
        (probe(alive=False), WorkerCondition.FAILED),
        (probe(state=TrainerState.FAILED), WorkerCondition.FAILED),
        (probe(state=TrainerState.DONE), WorkerCondition.DONE),
        (probe(state=TrainerState.PREEMPTED), WorkerCondition.PREEMPTED),
        (probe(preempted_flag=True), WorkerCondition.PREEMPTED),
        (probe(exit_code=1, exit_mtime=NOW, alive=False), WorkerCondition.FAILED),
        (probe(exit_code=137, exit_mtime=NOW, alive=False), WorkerCondition.FAILED),
        (probe(exit_code=75, exit_mtime=NOW, alive=False), WorkerCondition.PREEMPTED),
        (probe(exit_code=0, exit_mtime=NOW, alive=False), WorkerCondition.DONE),
        (probe(exit_code=1, exit_mtime=SINCE - 1), WorkerCondition.RUNNING),  # stale exit file
    ],
)
def test_worker_condition(p, condition):
    assert judge_worker(p, SINCE, LIMITS).condition is condition


@pytest.mark.parametrize(
    ("probes", "waited", "action", "condition"),
    [
        ([probe(0), probe(1)], never, Action.WAIT, WorkerCondition.RUNNING),
        ([probe(0), probe(1, alive=False)], never, Action.RESTART, WorkerCondition.FAILED),
        ([probe(0), probe(1, age=99)], never, Action.RESTART, WorkerCondition.HUNG),
        # a crash outranks a preemption notice elsewhere
        (
            [probe(0, state=TrainerState.PREEMPTED), probe(1, state=TrainerState.FAILED)],
            never,
            Action.RESTART,
            WorkerCondition.FAILED,
        ),
        ([probe(0, state=TrainerState.PREEMPTED), probe(1)], never, Action.WAIT, None),
        ([probe(0, state=TrainerState.PREEMPTED)], forever, Action.RESUME, None),
        ([probe(0, state=TrainerState.DONE), probe(1)], never, Action.WAIT, None),
        (
            [probe(0, state=TrainerState.DONE), probe(1, state=TrainerState.DONE)],
            never,
            Action.FINISH,
            WorkerCondition.DONE,
        ),
        ([Probe(0, reachable=False, error="x")], never, Action.WAIT, None),
        ([Probe(0, reachable=False, error="x")], forever, Action.REBUILD, None),
        ([Probe(0, bootstrap={"state": "failed"})], never, Action.REBUILD, None),
        ([Probe(0, bootstrap={"state": "running"})], forever, Action.REBUILD, None),
        ([Probe(0, bootstrap=OK, now=NOW)], forever, Action.RESTART, None),
    ],
)
def test_slice_wide_decision(probes, waited, action, condition):
    decision = decide(SliceState.READY, probes, SINCE, waited, LIMITS)
    assert decision.action is action
    if condition is not None:
        assert decision.condition is condition


def test_maintenance_health_is_a_preemption_notice():
    d = decide(SliceState.READY, [probe()], SINCE, never, LIMITS, "UNHEALTHY_MAINTENANCE")
    assert (d.action, d.condition) == (Action.WAIT, WorkerCondition.PREEMPTED)
    d = decide(SliceState.READY, [probe()], SINCE, forever, LIMITS, "UNHEALTHY_MAINTENANCE")
    assert d.action is Action.RESUME


def test_backoff_grows_and_is_capped():
    assert [backoff(n, 1.0, 5.0) for n in range(5)] == [0.0, 1.0, 2.0, 4.0, 5.0]


def test_a_trainer_without_progress_is_hung_even_with_a_fresh_heartbeat():
    stuck = probe(state=TrainerState.SAVING, age=1, progress_age=LIMITS.stall + 1)
    assert judge_worker(stuck, SINCE, LIMITS).condition is WorkerCondition.HUNG
    compiling = probe(state=TrainerState.COMPILING, age=1, progress_age=200)  # < start
    assert judge_worker(compiling, SINCE, LIMITS).condition is WorkerCondition.RUNNING
    compiling.progress_age = 301
    assert judge_worker(compiling, SINCE, LIMITS).condition is WorkerCondition.HUNG
