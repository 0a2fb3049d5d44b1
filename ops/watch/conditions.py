"""What a node state and one worker's probe mean: the conditions `ops.watch.judge` ranks into one
event per poll. Pure: no I/O, no clock; every branch of the policy is a row in a table below."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ops.cloud.slice import SliceState
from ops.fleet.job_status import JobRules
from ops.fleet.probe import Probe
from ops.watch.deadlines import Limits


class SliceAction(StrEnum):
    WAIT = "wait"  # a transition the TPU API finishes on its own
    CHECK_WORKERS = "check-workers"  # READY: the workers decide
    RECREATE = "recreate"  # gone for good: delete + create again (preemptions are free)


# TPU node state -> what watch does about it. A state it waits on is recreated once it outlasts
# its deadline (STATE_DEADLINES; else the transient one), like any state stuck in transition.
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
    SliceState.UNRECOGNIZED: SliceAction.WAIT,
    SliceState.READY: SliceAction.CHECK_WORKERS,
    # A spot node cannot be restarted: watch deletes it and creates it again from the spec.
    SliceState.STOPPED: SliceAction.RECREATE,
    SliceState.HIDDEN: SliceAction.RECREATE,
    SliceState.PREEMPTED: SliceAction.RECREATE,
    SliceState.TERMINATED: SliceAction.RECREATE,
    SliceState.MISSING: SliceAction.RECREATE,
}


# The states waited on with a deadline of their own (a Limits field), each announced once: Google's
# UNKNOWN (a failed repair: no transition that ends by itself) and a state the installed client
# cannot name (it may be a transition, or the end: it gets a while, not the transient 30 min).
STATE_DEADLINES: dict[SliceState, str] = {
    SliceState.UNKNOWN: "failed_repair",
    SliceState.UNRECOGNIZED: "unknown_state",
}


# TPU node health -> what it announces while the node is still READY (the notice period).
# On a spot node maintenance is the end (GCE terminates spot VMs for host maintenance): the job
# saves while it can. On an on-demand or reserved node the VM comes back by itself and its
# startup script starts the job again: watch waits and restarts nothing over SSH meanwhile.
NOTICE_HEALTH = {"UNHEALTHY_MAINTENANCE": "preemption notice"}
MAINTENANCE = "maintenance"  # the key a non-spot node's maintenance is timed under


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
    # 2. An exit code written after the last start is the final word on that job; so is the
    # code a job wrote with `failed` to its status, while its process is still exiting (judged
    # a crash in that window, a fatal refusal was restarted in a loop).
    noticed = probe.noticed(since)
    fresh_exit = probe.exit_code is not None and (probe.exit_mtime or 0) >= since
    if fresh_exit and not probe.alive:
        return judge_exit(probe, noticed, rules)
    status = probe.current(since)
    if status is not None and status.state == "failed" and status.exit_code is not None:
        return judge_exit(probe, noticed, rules, code=status.exit_code)
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
    # Only a writer that names its states and keeps a heartbeat (the built-in trainer) can say
    # it is saving or evaluating; a job that reports steps alone keeps the stall limit.
    clocked = probe.step_limit is not None and status.state == "training" and status.heartbeat
    if clocked and probe.step_limit < limit:  # the step clock sharpens the stall limit
        limit, why = probe.step_limit, " by the step clock"
    else:
        why = ""
    if stalled > limit:
        return Verdict(WorkerCondition.HUNG, f"{w} {status.state} at step {status.step} for "
                       f"{stalled:.0f}s (> {limit:.0f}s{why})")  # fmt: skip
    return Verdict(WorkerCondition.RUNNING, f"{w} {status.state} step {status.step}")


def judge_exit(probe: Probe, noticed: bool, rules: JobRules, code: int | None = None) -> Verdict:
    """The exit-code rules (README, "Exit codes"): after a notice or SIGTERM every exit is a
    preemption, 0 included; `preempted` codes restart free; `fatal` codes stop recovery; 0 is
    done (the slice-wide steps rule follows in decide_workers); anything else is a crash.
    `code`: the one the job's status said, where its exit file has none yet."""
    code, w = probe.exit_code if code is None else code, f"worker {probe.index}"
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
