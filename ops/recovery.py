"""The recovery state table: one observation of a slice -> one action. Pure: no I/O, no clock.

`ops.watch` gathers an `Observation` (provider state + one probe per worker) and asks `decide`;
every branch of the policy is a row in one of the tables below, so the whole strategy can be read
(and unit-tested) without running anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from ops.job_status import STARTING_STATES, JobRules
from ops.probe import Probe
from ops.provider import SliceState


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

    FATAL = "fatal"  # the job exited with one of its `exit_codes.fatal`
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
    STOP = "stop"  # a fatal exit: recovery stops, one line says why


# Slice-wide worker condition -> action. `deadline` conditions wait until their deadline, then act.
CONDITION_ACTIONS: dict[WorkerCondition, Action] = {
    WorkerCondition.FATAL: Action.STOP,
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
    WorkerCondition.FATAL: "fatal",
    WorkerCondition.FAILED: "crash",
    WorkerCondition.HUNG: "hang",
    WorkerCondition.PREEMPTED: "preemption",
    WorkerCondition.BOOTSTRAP_FAILED: "bootstrap-failed",
    WorkerCondition.BOOTSTRAPPING: "bootstrap-timeout",
    WorkerCondition.UNREACHABLE: "unreachable",
    WorkerCondition.STARTING: "start-timeout",
}

# A status file's final states (the built-in trainer writes them before it exits); any other
# state is a running job, judged by its heartbeat and its progress.
STATUS_CONDITIONS: dict[str, WorkerCondition] = {
    "preempted": WorkerCondition.PREEMPTED,
    "done": WorkerCondition.DONE,
    "failed": WorkerCondition.FAILED,
}
# Bootstrap state -> condition.
BOOTSTRAP_CONDITIONS: dict[str | None, WorkerCondition] = {
    None: WorkerCondition.BOOTSTRAPPING,
    "running": WorkerCondition.BOOTSTRAPPING,
    "failed": WorkerCondition.BOOTSTRAP_FAILED,
}


@dataclass(frozen=True)
class Limits:
    """Seconds. `hang`: the heartbeat age that is a frozen process (for a status file that
    carries a heartbeat); `start` and `stall`: the job's startup_timeout_s and hang_after_s."""

    hang: float = 60.0
    start: float = 900.0  # (re)start -> first progress; also the longest init/compile
    stall: float = 1800.0  # no new step slice-wide after the first (a heartbeat may still beat)
    bootstrap: float = 1800.0
    ssh: float = 120.0
    preempt_grace: float = 60.0  # job preempted but the node stays READY
    transient: float = 1800.0  # CREATING/REPAIRING/... before we recreate anyway

    def progress_limit(self, state: str) -> float:
        """How long a state may last without a new step before it counts as a hang."""
        return self.start if state in STARTING_STATES else self.stall

    def deadline(self, condition: WorkerCondition) -> float:
        return {
            WorkerCondition.PREEMPTED: self.preempt_grace,
            WorkerCondition.UNREACHABLE: self.ssh,
            WorkerCondition.BOOTSTRAPPING: self.bootstrap,
            WorkerCondition.STARTING: self.start,
        }[condition]


@dataclass
class Verdict:
    condition: WorkerCondition
    reason: str


def judge_worker(
    probe: Probe,
    since: float,
    limits: Limits,
    rules: JobRules = JobRules(),  # noqa: B008 - frozen
    slice_reports: bool = False,
) -> Verdict:
    """One worker's condition. `since`: the last (re)start; older files belong to a dead job.
    `slice_reports`: another worker reports progress (often only process 0 does)."""
    w = f"worker {probe.index}"
    # 1. Reachability and bootstrap come first: without them no job file means anything.
    if not probe.reachable:
        return Verdict(WorkerCondition.UNREACHABLE, f"{w} unreachable: {probe.error}")
    if probe.bootstrap_state != "ok":
        cond = BOOTSTRAP_CONDITIONS.get(probe.bootstrap_state, WorkerCondition.BOOTSTRAPPING)
        phase = (probe.bootstrap or {}).get("phase")
        return Verdict(cond, f"{w} bootstrap {probe.bootstrap_state or 'pending'} ({phase})")
    # 2. An exit code written after the last start is the final word on that job.
    noticed = probe.noticed(since)
    fresh_exit = probe.exit_code is not None and (probe.exit_mtime or 0) >= since
    if fresh_exit and not probe.alive:
        return judge_exit(probe, noticed, rules)
    status = probe.current(since)
    # 3. No progress from the current job yet: starting, or watched by liveness alone.
    if status is None:
        if noticed and probe.alive:
            return Verdict(WorkerCondition.PREEMPTED, f"{w} preemption notice")
        if probe.alive and (slice_reports or not rules.reports_progress):
            return Verdict(WorkerCondition.RUNNING, f"{w} job running")
        if probe.alive is False and not rules.reports_progress:
            return Verdict(WorkerCondition.FAILED, f"{w} job process gone")
        return Verdict(WorkerCondition.STARTING, f"{w} job starting")
    cond = STATUS_CONDITIONS.get(status.state, WorkerCondition.RUNNING)
    if noticed and cond is WorkerCondition.RUNNING:
        return Verdict(WorkerCondition.PREEMPTED, f"{w} preemption notice at step {status.step}")
    if cond is not WorkerCondition.RUNNING:
        return Verdict(cond, f"{w} job {status.state} at step {status.step}")
    # 4. A running job is alive only if its process is, its heartbeat (if it keeps one) is
    # recent, and the slice makes progress.
    if probe.alive is False:
        return Verdict(WorkerCondition.FAILED, f"{w} job process gone at step {status.step}")
    age = probe.heartbeat_age
    if age is not None and age > limits.hang:
        return Verdict(WorkerCondition.HUNG, f"{w} heartbeat {age:.0f}s old (> {limits.hang:.0f}s)")
    stalled, limit = probe.progress_age, limits.progress_limit(status.state)
    if stalled > limit:
        return Verdict(
            WorkerCondition.HUNG,
            f"{w} {status.state} at step {status.step} for {stalled:.0f}s (> {limit:.0f}s)",
        )
    return Verdict(WorkerCondition.RUNNING, f"{w} {status.state} step {status.step}")


def judge_exit(probe: Probe, noticed: bool, rules: JobRules) -> Verdict:
    """The exit-code rules (README, "Exit codes"): after a notice or SIGTERM every exit is a
    preemption, 0 included; `preempted` codes restart free; `fatal` codes stop recovery; 0 is
    done (the slice-wide steps rule follows in decide_workers); anything else is a crash."""
    code, w = probe.exit_code, f"worker {probe.index}"
    message = probe.status.message if probe.status and probe.status.message else ""
    said = f"{w} job exited {code} {message}".rstrip()
    if noticed:
        return Verdict(WorkerCondition.PREEMPTED, f"{said} after a preemption notice or SIGTERM")
    if code in rules.preempted:
        return Verdict(WorkerCondition.PREEMPTED, f"{said} (exit_codes.preempted)")
    if code in rules.fatal:
        return Verdict(WorkerCondition.FATAL, f"{said} (exit_codes.fatal: not restarted)")
    if code == 0:
        return Verdict(WorkerCondition.DONE, said)
    return Verdict(WorkerCondition.FAILED, said)


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


def decide_workers(
    probes: list[Probe],
    since: float,
    waited: Waited,
    limits: Limits,
    rules: JobRules,
    run_step: int | None = None,
) -> Decision:
    """Slice READY: the most urgent worker condition decides; a waiting condition acts once it
    has lasted longer than its deadline (`waited(key)`, tracked by the caller). `run_step`: the
    run's newest step the caller has seen (an attempt that restored the last step and exited
    at once reports none of its own)."""
    reporting = {p.index for p in probes if p.current(since)}
    verdicts = [judge_worker(p, since, limits, rules, bool(reporting - {p.index})) for p in probes]
    if not verdicts:
        return Decision(Action.WAIT, "no workers listed yet")
    worst = min(verdicts, key=lambda v: PRIORITY.index(v.condition))
    if worst.condition is WorkerCondition.DONE:
        if any(v.condition is not WorkerCondition.DONE for v in verdicts):
            return Decision(Action.WAIT, "some workers done", worst.condition, verdicts)
        reached = max((p.current(since).step for p in probes if p.current(since)),
                      default=run_step)  # fmt: skip
        if rules.steps and rules.reports_progress and (reached or 0) < rules.steps:
            reason = f"every worker exited 0 at step {reached}, before its {rules.steps} steps"
            return Decision(Action.RESTART, reason, WorkerCondition.FAILED, verdicts)
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
    rules: JobRules | None = None,
    run_step: int | None = None,
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
    return decide_workers(probes, since, waited, limits, rules or JobRules(), run_step)


def backoff(attempt: int, base: float = 2.0, cap: float = 60.0) -> float:
    """Seconds to wait before recovery attempt `attempt` (1-based): exponential, capped."""
    return min(cap, base * 2 ** max(0, attempt - 1)) if attempt > 0 else 0.0
