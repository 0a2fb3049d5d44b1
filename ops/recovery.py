"""The recovery state table: one observation of a slice -> one action. Pure: no I/O, no clock.

`ops.watch` gathers an `Observation` (provider state + one probe per worker) and asks `decide`;
every branch of the policy is a row in one of the tables below, so the whole strategy can be read
(and unit-tested) without running anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from ops.provider import SliceState
from trainer.status import EXIT_DONE, EXIT_PREEMPTED, TrainerState, TrainerStatus


class SliceAction(StrEnum):
    WAIT = "wait"  # a transition the TPU API finishes on its own
    CHECK_WORKERS = "check-workers"  # READY: the workers decide
    RECREATE = "recreate"  # gone for good: delete + create again (preemptions are free)


# TPU node state -> what watch does about it. UNKNOWN (a state newer than this table) waits and is
# recreated only once the transient deadline passes, like any other state stuck in transition.
SLICE_ACTIONS: dict[SliceState, SliceAction] = {
    SliceState.CREATING: SliceAction.WAIT,
    SliceState.STARTING: SliceAction.WAIT,
    SliceState.RESTARTING: SliceAction.WAIT,
    SliceState.REPAIRING: SliceAction.WAIT,
    SliceState.STOPPING: SliceAction.WAIT,
    SliceState.DELETING: SliceAction.WAIT,
    SliceState.REIMAGING: SliceAction.WAIT,
    SliceState.HIDING: SliceAction.WAIT,
    SliceState.UNHIDING: SliceAction.WAIT,
    SliceState.UNKNOWN: SliceAction.WAIT,
    SliceState.READY: SliceAction.CHECK_WORKERS,
    # A spot node cannot be restarted: watch deletes it and creates it again from the spec.
    SliceState.STOPPED: SliceAction.RECREATE,
    SliceState.HIDDEN: SliceAction.RECREATE,
    SliceState.PREEMPTED: SliceAction.RECREATE,
    SliceState.TERMINATED: SliceAction.RECREATE,
    SliceState.MISSING: SliceAction.RECREATE,
}


# TPU node health -> what it announces while the node is still READY (the notice period).
NOTICE_HEALTH = {"UNHEALTHY_MAINTENANCE": "preemption notice"}


class WorkerCondition(StrEnum):
    """One worker's situation, most urgent first (the order is the slice-wide priority)."""

    BOOTSTRAP_FAILED = "bootstrap-failed"
    FAILED = "failed"
    HUNG = "hung"
    PREEMPTED = "preempted"
    UNREACHABLE = "unreachable"
    BOOTSTRAPPING = "bootstrapping"
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"


PRIORITY = list(WorkerCondition)


class Action(StrEnum):
    WAIT = "wait"
    RECREATE = "recreate"  # slice preempted/terminated/missing: unlimited
    REBUILD = "rebuild"  # slice READY but unusable (bootstrap failed, unreachable): a failure
    RESTART = "restart"  # trainer crashed or hung: stop-all, clear-locks, start-all; a failure
    RESUME = "resume"  # trainer preempted but the slice survived: restart, not a failure
    FINISH = "finish"  # every worker done


# Slice-wide worker condition -> action. `deadline` conditions wait until their deadline, then act.
CONDITION_ACTIONS: dict[WorkerCondition, Action] = {
    WorkerCondition.BOOTSTRAP_FAILED: Action.REBUILD,
    WorkerCondition.FAILED: Action.RESTART,
    WorkerCondition.HUNG: Action.RESTART,
    WorkerCondition.PREEMPTED: Action.WAIT,  # the node goes PREEMPTED next; RESUME after grace
    WorkerCondition.UNREACHABLE: Action.WAIT,  # REBUILD after the ssh deadline
    WorkerCondition.BOOTSTRAPPING: Action.WAIT,  # REBUILD after the bootstrap deadline
    WorkerCondition.STARTING: Action.WAIT,  # RESTART after the start deadline
    WorkerCondition.RUNNING: Action.WAIT,
    WorkerCondition.DONE: Action.FINISH,
}
# What a waiting condition turns into once it outlasts its deadline.
ON_DEADLINE: dict[WorkerCondition, Action] = {
    WorkerCondition.PREEMPTED: Action.RESUME,
    WorkerCondition.UNREACHABLE: Action.REBUILD,
    WorkerCondition.BOOTSTRAPPING: Action.REBUILD,
    WorkerCondition.STARTING: Action.RESTART,
}

# What kind of incident a condition (or a dead slice) is, for the journal and the budgets.
INCIDENT_KINDS = {
    WorkerCondition.FAILED: "crash",
    WorkerCondition.HUNG: "hang",
    WorkerCondition.PREEMPTED: "preemption",
    WorkerCondition.BOOTSTRAP_FAILED: "bootstrap-failed",
    WorkerCondition.BOOTSTRAPPING: "bootstrap-timeout",
    WorkerCondition.UNREACHABLE: "unreachable",
    WorkerCondition.STARTING: "start-timeout",
}

# `trainer.exit` -> condition (anything else is a failure).
EXIT_CONDITIONS: dict[int, WorkerCondition] = {
    EXIT_DONE: WorkerCondition.DONE,
    EXIT_PREEMPTED: WorkerCondition.PREEMPTED,
}
# Status state -> condition; RUNNING states are judged by their heartbeat age as well.
STATUS_CONDITIONS: dict[TrainerState, WorkerCondition] = {
    TrainerState.INITIALIZING: WorkerCondition.RUNNING,
    TrainerState.COMPILING: WorkerCondition.RUNNING,
    TrainerState.TRAINING: WorkerCondition.RUNNING,
    TrainerState.SAVING: WorkerCondition.RUNNING,
    TrainerState.PREEMPTED: WorkerCondition.PREEMPTED,
    TrainerState.DONE: WorkerCondition.DONE,
    TrainerState.FAILED: WorkerCondition.FAILED,
}
# Bootstrap state -> condition.
BOOTSTRAP_CONDITIONS: dict[str | None, WorkerCondition] = {
    None: WorkerCondition.BOOTSTRAPPING,
    "running": WorkerCondition.BOOTSTRAPPING,
    "failed": WorkerCondition.BOOTSTRAP_FAILED,
}


@dataclass(frozen=True)
class Limits:
    """Seconds. `hang` is H: the heartbeat age that counts as a hang while training."""

    hang: float = 60.0
    start: float = 900.0  # (re)start -> first status; also the longest init/compile
    stall: float = 1800.0  # training/saving without a new step (a heartbeat thread still beats)
    bootstrap: float = 1800.0
    ssh: float = 120.0
    preempt_grace: float = 60.0  # trainer preempted but the node stays READY
    transient: float = 1800.0  # CREATING/REPAIRING/... before we recreate anyway

    def heartbeat_limit(self, state: TrainerState) -> float:
        """The trainer beats from a thread (trainer.metrics.Heartbeat) in every state, through
        compiles and saves: a stale heartbeat means a frozen process whatever the state."""
        return self.hang

    def progress_limit(self, state: TrainerState) -> float:
        """How long a state may last without a new step before it counts as a hang."""
        return (
            self.start
            if state in (TrainerState.INITIALIZING, TrainerState.COMPILING)
            else (self.stall)
        )

    def deadline(self, condition: WorkerCondition) -> float:
        return {
            WorkerCondition.PREEMPTED: self.preempt_grace,
            WorkerCondition.UNREACHABLE: self.ssh,
            WorkerCondition.BOOTSTRAPPING: self.bootstrap,
            WorkerCondition.STARTING: self.start,
        }[condition]


@dataclass
class Probe:
    """What one SSH round trip tells about a worker; `now` is the worker's clock."""

    index: int
    reachable: bool = True
    error: str | None = None
    bootstrap: dict | None = None
    status: TrainerStatus | None = None
    exit_code: int | None = None
    exit_mtime: float | None = None
    alive: bool | None = None
    preempted_flag: bool = False
    now: float = 0.0
    progress_age: float = 0.0  # seconds since this worker's (state, step) last changed (watcher)

    @property
    def bootstrap_state(self) -> str | None:
        return (self.bootstrap or {}).get("state")

    @property
    def heartbeat_age(self) -> float | None:
        return None if self.status is None else max(0.0, self.now - self.status.heartbeat)


@dataclass
class Verdict:
    condition: WorkerCondition
    reason: str


def judge_worker(probe: Probe, since: float, limits: Limits) -> Verdict:
    """One worker's condition. `since`: the last (re)start; older files belong to a dead trainer."""
    w = f"worker {probe.index}"
    # 1. Reachability and bootstrap come first: without them no trainer file means anything.
    if not probe.reachable:
        return Verdict(WorkerCondition.UNREACHABLE, f"{w} unreachable: {probe.error}")
    if probe.bootstrap_state != "ok":
        cond = BOOTSTRAP_CONDITIONS.get(probe.bootstrap_state, WorkerCondition.BOOTSTRAPPING)
        phase = (probe.bootstrap or {}).get("phase")
        return Verdict(cond, f"{w} bootstrap {probe.bootstrap_state or 'pending'} ({phase})")
    # 2. An exit code written after the last start is the final word on that trainer.
    fresh_exit = probe.exit_code is not None and (probe.exit_mtime or 0) >= since
    if fresh_exit and not probe.alive:
        cond = EXIT_CONDITIONS.get(probe.exit_code, WorkerCondition.FAILED)
        message = probe.status.message if probe.status and probe.status.message else ""
        return Verdict(cond, f"{w} trainer exited {probe.exit_code} {message}".rstrip())
    status = probe.status
    # 3. No status from the current trainer yet: it is starting (or never started).
    if status is None or status.heartbeat < since:
        return Verdict(WorkerCondition.STARTING, f"{w} trainer starting")
    cond = STATUS_CONDITIONS[status.state]
    if probe.preempted_flag and cond is WorkerCondition.RUNNING:
        return Verdict(WorkerCondition.PREEMPTED, f"{w} preemption notice at step {status.step}")
    if cond is not WorkerCondition.RUNNING:
        return Verdict(cond, f"{w} trainer {status.state} at step {status.step}")
    # 4. A running trainer is alive only if its process is and its heartbeat is recent.
    if probe.alive is False:
        return Verdict(WorkerCondition.FAILED, f"{w} trainer process gone at step {status.step}")
    age, limit = probe.heartbeat_age or 0.0, limits.heartbeat_limit(status.state)
    if age > limit:
        return Verdict(WorkerCondition.HUNG, f"{w} heartbeat {age:.0f}s old (> {limit:.0f}s)")
    stalled, limit = probe.progress_age, limits.progress_limit(status.state)
    if stalled > limit:
        return Verdict(
            WorkerCondition.HUNG,
            f"{w} {status.state} at step {status.step} for {stalled:.0f}s (> {limit:.0f}s)",
        )
    return Verdict(WorkerCondition.RUNNING, f"{w} {status.state} step {status.step}")


@dataclass
class Decision:
    action: Action
    reason: str
    condition: WorkerCondition | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    key: str | None = None  # what the caller times for deadlines (a slice state or a condition)

    def __post_init__(self) -> None:
        if self.key is None and self.condition is not None:
            self.key = str(self.condition)


# How long (seconds) the caller has seen a slice state or worker condition without a change.
Waited = Callable[[str], float]


def decide_workers(probes: list[Probe], since: float, waited: Waited, limits: Limits) -> Decision:
    """Slice READY: the most urgent worker condition decides; a waiting condition acts once it
    has lasted longer than its deadline (`waited(key)`, tracked by the caller)."""
    verdicts = [judge_worker(p, since, limits) for p in probes]
    if not verdicts:
        return Decision(Action.WAIT, "no workers listed yet")
    worst = min(verdicts, key=lambda v: PRIORITY.index(v.condition))
    if worst.condition is WorkerCondition.DONE and any(
        v.condition is not WorkerCondition.DONE for v in verdicts
    ):
        return Decision(Action.WAIT, "some workers done", worst.condition, verdicts)
    action = CONDITION_ACTIONS[worst.condition]
    if worst.condition in ON_DEADLINE and waited(worst.condition) > limits.deadline(
        worst.condition
    ):
        action = ON_DEADLINE[worst.condition]
    return Decision(action, worst.reason, worst.condition, verdicts)


def decide(
    state: SliceState,
    probes: list[Probe],
    since: float,
    waited: Waited,
    limits: Limits,
    health: str | None = None,
) -> Decision:
    """The whole table: slice state first, its health next, then the workers."""
    slice_action = SLICE_ACTIONS[state]
    if slice_action is SliceAction.CHECK_WORKERS and health in NOTICE_HEALTH:
        # The node is going away: wait for it (the trainer saves), then recreate.
        cond = WorkerCondition.PREEMPTED
        decision = Decision(Action.WAIT, f"{NOTICE_HEALTH[health]} ({health})", cond)
        if waited(cond) > limits.preempt_grace:
            decision.action = Action.RESUME
        return decision
    if slice_action is SliceAction.RECREATE:
        return Decision(Action.RECREATE, f"slice {state}", key=state)
    if slice_action is SliceAction.WAIT:
        if waited(state) > limits.transient:
            return Decision(Action.RECREATE, f"slice {state} for {waited(state):.0f}s", key=state)
        return Decision(Action.WAIT, f"slice {state}", key=state)
    return decide_workers(probes, since, waited, limits)


def backoff(attempt: int, base: float = 2.0, cap: float = 60.0) -> float:
    """Seconds to wait before recovery attempt `attempt` (1-based): exponential, capped."""
    return min(cap, base * 2 ** max(0, attempt - 1)) if attempt > 0 else 0.0
