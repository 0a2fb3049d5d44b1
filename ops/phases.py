"""The recovery table: where an incident stands -> what happened this poll -> next phase and the
one short step `ops.watch` takes. Pure: no I/O, no clock (the caller says what it observed).

A recreate is delete (await its operation) -> create (await it; a stockout waits for capacity and
creates again) -> await READY -> await bootstrap -> restart done by the startup script -> await
resume. A failure restart is stop/clear/start -> await resume. Every phase has its own deadline;
the phase, its operation name and start time are persisted (`ops.incident`), so a restarted
`watch` resumes the table where it stopped instead of creating a node twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ops.provider import SliceState


class Phase(StrEnum):
    WATCHING = "watching"  # no recovery step pending: the observation table (ops.recovery) decides
    PENDING_RECREATE = "pending-recreate"  # backing off before delete + create
    AWAITING_DELETE = "awaiting-delete"  # delete operation issued
    AWAITING_CREATE = "awaiting-create"  # create operation issued
    AWAITING_CAPACITY = "awaiting-capacity"  # the create hit a stockout: retry after a backoff
    AWAITING_READY = "awaiting-ready"  # created: the node becomes READY
    AWAITING_BOOTSTRAP = "awaiting-bootstrap"  # READY: the startup script runs on every worker
    PENDING_RESTART = "pending-restart"  # backing off before a failure restart
    AWAITING_RESUME = "awaiting-resume"  # trainer (re)started: the observation table judges it


class Event(StrEnum):
    WAITING = "waiting"  # a backoff not over yet
    DUE = "due"  # the backoff is over
    RUNNING = "running"  # operation not done / slice not READY / bootstrap still running
    DONE = "done"  # operation done / slice READY / bootstrap ok on every worker
    STOCKOUT = "stockout"  # create refused or failed for capacity
    FAILED = "failed"  # operation error, or a bootstrap failed
    GONE = "gone"  # the node was preempted, terminated or deleted meanwhile
    DEADLINE = "deadline"  # the phase outlasted its deadline


class Step(StrEnum):
    NONE = "none"
    DELETE = "delete"  # issue nodes.delete
    CREATE = "create"  # issue nodes.create from the spec
    STOCKOUT = "stockout"  # journal it, spend the capacity budget, back off
    RETRY = "retry"  # journal the error, back off, recreate again (no budget spent)
    REBUILD = "rebuild"  # a failure: charge the failure budget, then recreate
    RECREATED = "recreated"  # journal `recreated`
    READY = "ready"  # journal `ready`; files older than now are stale
    BOOTSTRAPPED = "bootstrapped"  # journal `bootstrapped`
    RESTART = "restart"  # trainerctl stop, clear-locks, start on every worker
    HAND_BACK = "hand-back"  # let the observation table decide (it sees what went wrong)


# (phase, event) -> (next phase, step). A pair not listed keeps the phase and does nothing.
TABLE: dict[tuple[Phase, Event], tuple[Phase, Step]] = {
    (Phase.PENDING_RECREATE, Event.DUE): (Phase.AWAITING_DELETE, Step.DELETE),
    (Phase.AWAITING_DELETE, Event.DONE): (Phase.AWAITING_CREATE, Step.CREATE),
    (Phase.AWAITING_DELETE, Event.FAILED): (Phase.PENDING_RECREATE, Step.RETRY),
    (Phase.AWAITING_DELETE, Event.DEADLINE): (Phase.PENDING_RECREATE, Step.RETRY),
    (Phase.AWAITING_CREATE, Event.DONE): (Phase.AWAITING_READY, Step.RECREATED),
    (Phase.AWAITING_CREATE, Event.STOCKOUT): (Phase.AWAITING_CAPACITY, Step.STOCKOUT),
    (Phase.AWAITING_CREATE, Event.FAILED): (Phase.PENDING_RECREATE, Step.RETRY),
    (Phase.AWAITING_CREATE, Event.DEADLINE): (Phase.PENDING_RECREATE, Step.RETRY),
    (Phase.AWAITING_CAPACITY, Event.DUE): (Phase.AWAITING_CREATE, Step.CREATE),
    (Phase.AWAITING_READY, Event.DONE): (Phase.AWAITING_BOOTSTRAP, Step.READY),
    (Phase.AWAITING_READY, Event.GONE): (Phase.PENDING_RECREATE, Step.RETRY),
    (Phase.AWAITING_READY, Event.DEADLINE): (Phase.PENDING_RECREATE, Step.RETRY),
    (Phase.AWAITING_BOOTSTRAP, Event.DONE): (Phase.AWAITING_RESUME, Step.BOOTSTRAPPED),
    (Phase.AWAITING_BOOTSTRAP, Event.FAILED): (Phase.WATCHING, Step.HAND_BACK),
    (Phase.AWAITING_BOOTSTRAP, Event.GONE): (Phase.WATCHING, Step.HAND_BACK),
    (Phase.AWAITING_BOOTSTRAP, Event.DEADLINE): (Phase.PENDING_RECREATE, Step.REBUILD),
    (Phase.PENDING_RESTART, Event.DUE): (Phase.AWAITING_RESUME, Step.RESTART),
    (Phase.PENDING_RESTART, Event.GONE): (Phase.WATCHING, Step.HAND_BACK),
}
# Phases the table drives; in the others the observation table decides each poll.
DRIVEN = {phase for phase, _ in TABLE}
# What the caller observes in each driven phase.
OBSERVES: dict[Phase, str] = {
    Phase.PENDING_RECREATE: "clock",
    Phase.AWAITING_CAPACITY: "clock",
    Phase.PENDING_RESTART: "clock+slice",
    Phase.AWAITING_DELETE: "operation",
    Phase.AWAITING_CREATE: "operation",
    Phase.AWAITING_READY: "slice",
    Phase.AWAITING_BOOTSTRAP: "slice+workers",
}
# Node states that end a wait early: the new node failed or was taken again.
GONE_STATES = {SliceState.PREEMPTED, SliceState.TERMINATED, SliceState.MISSING}


@dataclass(frozen=True)
class Transition:
    phase: Phase
    step: Step


def advance(phase: Phase, event: Event) -> Transition:
    next_phase, step = TABLE.get((phase, event), (phase, Step.NONE))
    return Transition(next_phase, step)


# -- observations -> events (pure: the caller passes what it saw and how long it has waited) ------
def clock_event(now: float, not_before: float) -> Event:
    return Event.DUE if now >= not_before else Event.WAITING


def operation_event(
    done: bool, error_code: int, stockout: bool, waited: float, deadline: float
) -> Event:
    if done:
        return Event.STOCKOUT if stockout else (Event.FAILED if error_code else Event.DONE)
    return Event.DEADLINE if waited > deadline else Event.RUNNING


def slice_event(state: SliceState, waited: float, deadline: float) -> Event:
    if state is SliceState.READY:
        return Event.DONE
    if state in GONE_STATES:
        return Event.GONE
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
