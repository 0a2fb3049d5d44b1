"""What was observed -> one `Event` for the recovery table (ops.watch.transitions). Pure: no I/O, no
clock; the caller passes what it saw and how long it has waited.

The judged phases see the node and a probe per worker: `decide` ranks the workers' conditions
(ops.watch.conditions) and names the event. The waiting phases see one thing each: a clock, an
operation, the node, the workers' bootstrap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ops.cloud import queued
from ops.cloud.slice import SliceInfo, SliceState
from ops.fleet.job_status import JobRules
from ops.fleet.probe import Probe
from ops.watch.conditions import (
    MAINTENANCE,
    NOTICE_HEALTH,
    PRIORITY,
    SLICE_ACTIONS,
    STATE_DEADLINES,
    SliceAction,
    Verdict,
    WorkerCondition,
    judge_worker,
)
from ops.watch.deadlines import Limits
from ops.watch.transitions import Event

# Slice-wide worker condition -> event. A waiting condition (CALM, NOTICE) becomes the event
# in ON_DEADLINE once it outlasts its deadline (Limits.deadline).
CONDITION_EVENTS: dict[WorkerCondition, Event] = {
    WorkerCondition.FATAL: Event.FATAL,
    WorkerCondition.BOOTSTRAP_FAILED: Event.UNUSABLE,
    WorkerCondition.FAILED: Event.JOB_FAILED,
    WorkerCondition.HUNG: Event.JOB_FAILED,
    WorkerCondition.PREEMPTED: Event.NOTICE,  # the node goes PREEMPTED next; or after grace:
    WorkerCondition.UNREACHABLE: Event.CALM,  # UNUSABLE after the ssh deadline
    WorkerCondition.BOOTSTRAPPING: Event.CALM,  # UNUSABLE after the bootstrap deadline
    WorkerCondition.STARTING: Event.CALM,  # JOB_FAILED after the start deadline
    WorkerCondition.RUNNING: Event.CALM,
    WorkerCondition.DONE: Event.ALL_DONE,
}
ON_DEADLINE: dict[WorkerCondition, Event] = {
    WorkerCondition.PREEMPTED: Event.JOB_PREEMPTED,
    WorkerCondition.UNREACHABLE: Event.UNUSABLE,
    WorkerCondition.BOOTSTRAPPING: Event.UNUSABLE,
    WorkerCondition.STARTING: Event.JOB_FAILED,
}
# The limit each waiting condition has (Limits' field), before it becomes its ON_DEADLINE event.
CONDITION_DEADLINES: dict[WorkerCondition, str] = {
    WorkerCondition.PREEMPTED: "preempt_grace",
    WorkerCondition.UNREACHABLE: "ssh",
    WorkerCondition.BOOTSTRAPPING: "bootstrap",
    WorkerCondition.STARTING: "start",
}
GONE_STATES = {SliceState.PREEMPTED, SliceState.TERMINATED, SliceState.MISSING}
# A FAILED queued resource's error, as ops.cloud.tpu_errors.failure_kind reads it -> event.
REFUSALS = {"stockout": Event.STOCKOUT, "quota": Event.QUOTA, "region-quota": Event.REGION_QUOTA,
            "other": Event.REQUEST_FAILED}  # fmt: skip
# How long (seconds) the caller has seen a slice state or worker condition without a change.
Waited = Callable[[str], float]


@dataclass
class Decision:
    event: Event
    reason: str
    condition: WorkerCondition | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    key: str | None = None  # what the caller times for deadlines (a slice state or a condition)

    def __post_init__(self) -> None:
        if self.key is None and self.condition is not None:
            self.key = str(self.condition)


def decide_workers(
    probes: list[Probe],
    since: float,
    waited: Waited,
    limits: Limits,
    rules: JobRules,
    run_step: int | None = None,
    bundle: str | None = None,
) -> Decision:
    """Slice READY: the most urgent worker condition decides; a waiting condition acts once it
    has lasted longer than its deadline (`waited(key)`, tracked by the caller). `run_step`: the
    run's newest step the caller has seen (an attempt that restored the last step and exited
    at once reports none of its own). `bundle`: what the node's metadata names; a slice whose
    every worker runs its job on another bundle gets it rolled out."""
    reporting = {p.index for p in probes if p.current(since)}
    verdicts = [judge_worker(p, since, limits, rules, bool(reporting - {p.index})) for p in probes]
    if not verdicts:
        return Decision(Event.CALM, "no workers listed yet")
    worst = min(verdicts, key=lambda v: PRIORITY.index(v.condition))
    if worst.condition is WorkerCondition.DONE:
        if any(v.condition is not WorkerCondition.DONE for v in verdicts):
            return Decision(Event.CALM, "some workers done", worst.condition, verdicts)
        reached = max((p.current(since).step for p in probes if p.current(since)),
                      default=run_step)  # fmt: skip
        if rules.steps and rules.reports_progress and (reached or 0) < rules.steps:
            reason = f"every worker exited 0 at step {reached}, before its {rules.steps} steps"
            return Decision(Event.JOB_FAILED, reason, WorkerCondition.FAILED, verdicts)
    event = CONDITION_EVENTS[worst.condition]
    running = [p.bootstrap_bundle for p in probes]
    # Only workers that say which bundle they run are compared (a bootstrap that names none is
    # not tpupod's startup script: nothing to roll out onto it).
    stale = sorted({b[:12] for b in running if b != bundle}) if all(running) else []
    if worst.condition is WorkerCondition.RUNNING and bundle and stale:
        old = ", ".join(stale)
        reason = f"the node names bundle {bundle[:12]}; workers run {old}"
        return Decision(Event.NEW_BUNDLE, reason, worst.condition, verdicts)
    limit = CONDITION_DEADLINES.get(worst.condition)
    if limit and waited(worst.condition) > getattr(limits, limit):
        event = ON_DEADLINE[worst.condition]
    return Decision(event, worst.reason, worst.condition, verdicts)


def decide(
    seen: SliceInfo,
    probes: list[Probe],
    since: float,
    waited: Waited,
    limits: Limits,
    rules: JobRules | None = None,
    run_step: int | None = None,
) -> Decision:
    """A judged phase's event: the slice as the TPU API described it (`seen`: its state first,
    its health next, whether it is spot (maintenance ends it) or on-demand or reserved, the
    bundle its metadata names, what the API said of a state it cannot name), then the workers."""
    state, health, detail = seen.state, seen.health, seen.detail
    slice_action = SLICE_ACTIONS[state]
    if slice_action is SliceAction.CHECK_WORKERS and health in NOTICE_HEALTH and not seen.spot:
        if waited(MAINTENANCE) > limits.transient:
            why = f"maintenance ({health}) for {waited(MAINTENANCE):.0f}s"
            return Decision(Event.SLICE_LOST, why, key=MAINTENANCE)
        why = f"maintenance ({health}): the node resumes by itself, its job at boot"
        return Decision(Event.CALM, why, key=MAINTENANCE)
    if slice_action is SliceAction.CHECK_WORKERS and health in NOTICE_HEALTH:
        return decide_spot_maintenance(health, waited(MAINTENANCE), limits)
    if slice_action is SliceAction.RECREATE:
        return Decision(Event.SLICE_LOST, f"slice {state}", key=state)
    if slice_action is SliceAction.WAIT:
        return decide_waiting(state, waited(state), limits, detail)
    return decide_workers(probes, since, waited, limits, rules or JobRules(), run_step,
                          seen.bundle)  # fmt: skip


def decide_spot_maintenance(health: str, waited: float, limits: Limits) -> Decision:
    """A spot node under maintenance is going away: wait while the job saves (the notice's
    grace), then the one in-place restart of this maintenance event (the table has its row only
    from a calm slice, so one per event), and past `spot_maintenance` it counts as lost."""
    cond, said = WorkerCondition.PREEMPTED, f"{NOTICE_HEALTH[health]} ({health})"
    if waited > limits.spot_maintenance:
        limit = limits.spot_maintenance
        why = f"{said} for {waited:.0f}s (deadline spot_maintenance, {limit:.0f}s): lost"
        return Decision(Event.SLICE_LOST, why, cond, key=MAINTENANCE)
    event = Event.SPOT_MAINTENANCE if waited > limits.preempt_grace else Event.NOTICE
    return Decision(event, said, cond, key=MAINTENANCE)


def decide_waiting(
    state: SliceState, waited: float, limits: Limits, detail: str | None
) -> Decision:
    """A node in a state watch waits on: lost once it outlasts its deadline; a state with a
    deadline of its own (STATE_DEADLINES) says so, for the journal's one line."""
    name = STATE_DEADLINES.get(state, "transient")
    limit = getattr(limits, name)
    if waited > limit:
        why = f"slice {state} for {waited:.0f}s (deadline {name}, {limit:.0f}s)"
        return Decision(Event.SLICE_LOST, why, key=state)
    if state in STATE_DEADLINES:
        said = f" ({detail})" if detail and detail != state else ""
        why = f"slice {state}{said}: waiting up to {limit:.0f}s ({name}), then recreating it"
        return Decision(Event.UNKNOWN_STATE, why, key=state)
    return Decision(Event.CALM, f"slice {state}", key=state)


# -- the waiting phases: one observation each -----------------------------------------------------
def clock_event(now: float, not_before: float) -> Event:
    return Event.DUE if now >= not_before else Event.WAITING


def operation_event(
    done: bool, error_code: int, stockout: bool, waited: float, deadline: float
) -> Event:
    if done:
        return Event.STOCKOUT if stockout else (Event.FAILED if error_code else Event.DONE)
    return Event.DEADLINE if waited > deadline else Event.RUNNING


def request_event(state: str, waited: float, limit: float, first: bool = False,
                  failure: str = "stockout", spread: bool = False) -> Event:  # fmt: skip
    """A queued resource (ops.cloud.queued) `waited` seconds in `state`: filled, FAILED (as its error
    says: `failure`, REFUSALS), dead (filed anew), or on its way until its state's `limit`
    (WatchConfig.request_limit); past it a request still in the zone's queue has another zone's
    filed beside it (`spread`: a zone holds none of ours yet), one stuck elsewhere is filed
    anew. A state the client cannot name is announced when `first` seen."""
    if state == queued.UNRECOGNIZED and first and waited <= limit:
        return Event.UNKNOWN_STATE
    if state == queued.FILLED:
        return Event.DONE
    if state == queued.UNFILLED:
        return REFUSALS[failure]
    if state in queued.DEAD:
        return Event.GONE
    if waited > limit and state == queued.WAITING:
        return Event.PATIENCE if spread else Event.STOCKOUT
    if waited > limit:
        return Event.DEADLINE
    return Event.RUNNING


def slice_event(state: SliceState, waited: float, deadline: float, in_state: float = 0.0,
                limits: Limits | None = None) -> Event:  # fmt: skip
    """A node awaited READY: `waited` in the phase against its `deadline`, and a state with a
    deadline of its own (STATE_DEADLINES: Google's UNKNOWN, a state the client cannot name)
    `in_state` seconds against that one, as a READY slice's would be (decide_waiting)."""
    if state is SliceState.READY:
        return Event.DONE
    if state in GONE_STATES:
        return Event.GONE
    own = STATE_DEADLINES.get(state)
    if own and limits is not None and in_state > getattr(limits, own):
        return Event.DEADLINE
    return Event.DEADLINE if waited > deadline else Event.RUNNING


def bootstrap_event(
    state: SliceState, boot_states: list[str | None], waited: float, deadline: float
) -> Event:
    """`boot_states`: each worker's bootstrap.json state (None: unreachable or not written)."""
    if state is not SliceState.READY:
        return Event.GONE
    if "failed" in boot_states:
        return Event.FAILED
    if boot_states and all(s == "ok" for s in boot_states):
        return Event.DONE
    return Event.DEADLINE if waited > deadline else Event.RUNNING


def refine(event: Event, recovering: bool, resumed: bool) -> Event:
    """The judged event in the light of the open incident: a notice or a state waited on during
    a recovery belongs to it (no new incident), and a calm slice after a recovery is RESUMED
    once every worker's job runs and reports a step again."""
    if recovering and event in (Event.NOTICE, Event.UNKNOWN_STATE):
        return Event.CALM
    if recovering and event is Event.CALM and resumed:
        return Event.RESUMED
    return event
