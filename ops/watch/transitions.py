"""The recovery table: (phase, event) -> (next phase, action). Every transition of `tpupod watch`
goes through `advance` and nothing else changes a phase; the watcher journals each one.

Pure: no I/O, no clock. `ops.watch.judge` turns what was observed into an `Event`, and
`ops.watch.actions` holds one plain function per `Action`, which returns the next event
(`Then`) or None. `python -m ops.watch` prints the
table as markdown, with the deadlines of what the phases wait on (ops.watch.drawing;
docs/recovery-table.md is generated from it; a test keeps it current).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Phase(StrEnum):
    WATCHING = "watching"  # no recovery step pending: the workers are judged each poll
    PENDING_RECREATE = "pending-recreate"  # backing off before delete + create
    AWAITING_DELETE = "awaiting-delete"  # delete operation issued
    AWAITING_CREATE = "awaiting-create"  # create operation issued
    AWAITING_QUEUED = "awaiting-queued"  # a queued resource filed: it waits for capacity
    AWAITING_CAPACITY = "awaiting-capacity"  # the create hit a stockout: retry after a backoff
    AWAITING_READY = "awaiting-ready"  # created: the node becomes READY
    AWAITING_BOOTSTRAP = "awaiting-bootstrap"  # READY: the startup script runs on every worker
    PENDING_RESTART = "pending-restart"  # backing off before a failure restart
    AWAITING_RESUME = "awaiting-resume"  # the job (re)started: the workers are judged each poll


class Event(StrEnum):
    # What the phases that wait observe (ops.watch.judge: clock, operation, node, bootstrap).
    WAITING = "waiting"  # a backoff not over yet
    DUE = "due"  # the backoff is over
    RUNNING = "running"  # operation not done / slice not READY / bootstrap still running
    DONE = "done"  # operation done / slice READY / bootstrap ok on every worker
    STOCKOUT = "stockout"  # create refused or failed for capacity, or queued too long here
    QUOTA = "quota"  # create refused for a zone's quota (HTTP 429 whose body names a quota)
    REGION_QUOTA = "region-quota"  # refused for a region's quota: no zone of it can help
    QUEUED = "queued"  # the create filed a queued resource: its node comes with capacity
    PATIENCE = "patience"  # queued past the zone's patience, and a zone holds no request of ours
    REFUSED_BESIDE = "refused-beside"  # a create beside a waiting request refused (quota, ...)
    REQUEST_FAILED = "request-failed"  # the queued resource FAILED, not for capacity or quota
    FAILED = "failed"  # operation error, or a bootstrap failed
    GONE = "gone"  # the node was preempted, terminated or deleted meanwhile
    DEADLINE = "deadline"  # the phase outlasted its deadline
    NOT_ISSUED = "not-issued"  # the delete could not be issued (a TPU API error): again later
    LOST = "lost"  # a create was issued before a restart and its operation name not saved
    # What the judged phases observe (node + workers: ops.watch.judge.decide).
    CALM = "calm"  # running, starting, or a transition the TPU API finishes by itself
    NOTICE = "notice"  # a preemption notice: the job saves, the node goes next
    SPOT_MAINTENANCE = "spot-maintenance"  # a spot node still under maintenance past the grace
    UNKNOWN_STATE = "unknown-state"  # a state the client cannot name, or Google's UNKNOWN
    RESUMED = "resumed"  # after a recovery, every worker's job runs and reports a step again
    SLICE_LOST = "slice-lost"  # preempted, terminated, missing, or stuck in transition
    UNUSABLE = "unusable"  # READY but its bootstrap failed or a worker stays unreachable
    JOB_FAILED = "job-failed"  # crashed, hung, or never started
    JOB_PREEMPTED = "job-preempted"  # the job stopped for a preemption; the node survived
    ALL_DONE = "all-done"  # every worker's job is done
    FATAL = "fatal"  # a fatal exit code: restarting cannot help
    NEW_BUNDLE = "new-bundle"  # the node's metadata names a bundle the healthy workers do not run


class WaitsFor(StrEnum):
    """What a waiting phase looks at each poll to make its event (ops.watch.judge)."""

    CLOCK = "clock"  # its backoff
    OPERATION = "operation"  # its delete or create operation
    REQUEST = "request"  # its queued resource's state
    NODE = "node"  # the node's state
    CLOCK_AND_NODE = "clock+node"  # its backoff, while the node stays READY
    BOOTSTRAP = "bootstrap"  # the node's state and every worker's bootstrap


class Action(StrEnum):
    NONE = "none"
    DELETE = "delete"  # issue nodes.delete
    CREATE = "create"  # issue nodes.create from the spec
    STOCKOUT = "stockout"  # journal it, spend the capacity budget, next zone, back off
    QUOTA = "quota"  # journal the quota, spend the quota budget, next zone, back off
    REGION_QUOTA = "region-quota"  # journal the quota, spend the quota budget, back off here
    QUEUED = "queued"  # journal `queued`: the request waits in the zone's queue
    FILE_BESIDE = "file-beside"  # the next zone's request filed beside the waiting one
    KEEP_PLACE = "keep-place"  # journal the refusal: the waiting request keeps its place
    FILLED = "filled"  # the first request ACTIVE wins: withdraw the others, journal `recreated`
    RETRY = "retry"  # journal the error, back off, recreate again (no budget spent)
    REQUEST_FAILED = "request-failed"  # journal the error, spend its budget, back off, file anew
    REBUILD = "rebuild"  # a failure: charge the failure budget, then recreate
    RECREATED = "recreated"  # journal `recreated`
    READY = "ready"  # journal `ready`; files older than now are stale
    BOOTSTRAPPED = "bootstrapped"  # journal `bootstrapped`
    RESTART = "restart"  # stop, clear-locks, start on every worker (a failure restart)
    HAND_BACK = "hand-back"  # let the judged phase decide next poll (it sees what went wrong)
    OPEN_RECREATE = "open-recreate"  # a preemption: count it, back off, delete + create
    OPEN_REBUILD = "open-rebuild"  # an unusable slice: charge a failure, back off, recreate
    OPEN_RESTART = "open-restart"  # a crash or hang: keep its stacks, charge, back off
    RESTART_FREE = "restart-free"  # a preempted job on a surviving node: restart, no charge
    NOTE_NOTICE = "note-notice"  # open a preemption incident while the job saves
    NOTE_STATE = "note-state"  # open an incident for a node state waited on up to its deadline
    NOTE_REQUEST = "note-request"  # journal a queued resource's state the client cannot name
    CLOSE = "close"  # journal `resumed` with the steps lost; the incident is over
    FINISH = "finish"  # journal `done`: watch exits 0
    STOP = "stop"  # journal the fatal exit: watch exits 3
    ROLL_OUT = "roll-out"  # the new bundle onto the running slice: save, stop, fetch, start


P, E, A = Phase, Event, Action
# Phases whose workers are judged each poll (ops.watch.judge.decide); the others wait for one
# thing each (WAITS_FOR) with a deadline of their own (ops.watch.deadlines).
JUDGED = (P.WATCHING, P.AWAITING_RESUME)
_JUDGED_ROWS: dict[Event, tuple[Phase | None, Action]] = {  # None: stay in the judged phase
    E.NOTICE: (None, A.NOTE_NOTICE),
    E.UNKNOWN_STATE: (None, A.NOTE_STATE),
    E.RESUMED: (P.WATCHING, A.CLOSE),
    E.SLICE_LOST: (P.PENDING_RECREATE, A.OPEN_RECREATE),
    E.UNUSABLE: (P.PENDING_RECREATE, A.OPEN_REBUILD),
    E.JOB_FAILED: (P.PENDING_RESTART, A.OPEN_RESTART),
    E.JOB_PREEMPTED: (P.AWAITING_RESUME, A.RESTART_FREE),
    E.ALL_DONE: (P.WATCHING, A.FINISH),
    E.FATAL: (None, A.STOP),
}
TABLE: dict[tuple[Phase, Event], tuple[Phase, Action]] = {
    (P.PENDING_RECREATE, E.DUE): (P.AWAITING_DELETE, A.DELETE),
    (P.AWAITING_DELETE, E.DONE): (P.AWAITING_CREATE, A.CREATE),
    (P.AWAITING_DELETE, E.NOT_ISSUED): (P.PENDING_RECREATE, A.NONE),
    (P.AWAITING_DELETE, E.FAILED): (P.PENDING_RECREATE, A.RETRY),
    (P.AWAITING_DELETE, E.DEADLINE): (P.PENDING_RECREATE, A.RETRY),
    (P.AWAITING_CREATE, E.DONE): (P.AWAITING_READY, A.RECREATED),
    (P.AWAITING_CREATE, E.LOST): (P.AWAITING_CREATE, A.CREATE),
    (P.AWAITING_CREATE, E.STOCKOUT): (P.AWAITING_CAPACITY, A.STOCKOUT),
    (P.AWAITING_CREATE, E.QUOTA): (P.AWAITING_CAPACITY, A.QUOTA),
    (P.AWAITING_CREATE, E.REGION_QUOTA): (P.AWAITING_CAPACITY, A.REGION_QUOTA),
    (P.AWAITING_CREATE, E.QUEUED): (P.AWAITING_QUEUED, A.QUEUED),
    (P.AWAITING_CREATE, E.REFUSED_BESIDE): (P.AWAITING_QUEUED, A.KEEP_PLACE),
    (P.AWAITING_CREATE, E.FAILED): (P.PENDING_RECREATE, A.RETRY),
    (P.AWAITING_CREATE, E.DEADLINE): (P.PENDING_RECREATE, A.RETRY),
    (P.AWAITING_QUEUED, E.DONE): (P.AWAITING_READY, A.FILLED),
    (P.AWAITING_QUEUED, E.PATIENCE): (P.AWAITING_CAPACITY, A.FILE_BESIDE),  # then create there
    # FAILED, judged by its error: capacity, a zone's or a region's quota, or its own problem
    (P.AWAITING_QUEUED, E.STOCKOUT): (P.AWAITING_CAPACITY, A.STOCKOUT),  # another zone's turn
    (P.AWAITING_QUEUED, E.QUOTA): (P.AWAITING_CAPACITY, A.QUOTA),
    (P.AWAITING_QUEUED, E.REGION_QUOTA): (P.AWAITING_CAPACITY, A.REGION_QUOTA),
    (P.AWAITING_QUEUED, E.REQUEST_FAILED): (P.PENDING_RECREATE, A.REQUEST_FAILED),
    (P.AWAITING_QUEUED, E.GONE): (P.PENDING_RECREATE, A.RETRY),  # SUSPENDED, gone: file anew
    (P.AWAITING_QUEUED, E.DEADLINE): (P.PENDING_RECREATE, A.RETRY),
    (P.AWAITING_QUEUED, E.UNKNOWN_STATE): (P.AWAITING_QUEUED, A.NOTE_REQUEST),
    (P.AWAITING_CAPACITY, E.DUE): (P.AWAITING_CREATE, A.CREATE),
    (P.AWAITING_READY, E.DONE): (P.AWAITING_BOOTSTRAP, A.READY),
    (P.AWAITING_READY, E.GONE): (P.PENDING_RECREATE, A.RETRY),
    (P.AWAITING_READY, E.DEADLINE): (P.PENDING_RECREATE, A.RETRY),
    (P.AWAITING_BOOTSTRAP, E.DONE): (P.AWAITING_RESUME, A.BOOTSTRAPPED),
    (P.AWAITING_BOOTSTRAP, E.FAILED): (P.WATCHING, A.HAND_BACK),
    (P.AWAITING_BOOTSTRAP, E.GONE): (P.WATCHING, A.HAND_BACK),
    (P.AWAITING_BOOTSTRAP, E.DEADLINE): (P.PENDING_RECREATE, A.REBUILD),
    (P.PENDING_RESTART, E.DUE): (P.AWAITING_RESUME, A.RESTART),
    (P.PENDING_RESTART, E.GONE): (P.WATCHING, A.HAND_BACK),
    # Only from a calm slice: a recovery (a failed rollout's included) finishes first.
    (P.WATCHING, E.NEW_BUNDLE): (P.AWAITING_RESUME, A.ROLL_OUT),
    # One in-place restart per maintenance event: in awaiting-resume the event has no row; the
    # node counts as lost (slice-lost) once the maintenance outlasts its deadline.
    (P.WATCHING, E.SPOT_MAINTENANCE): (P.AWAITING_RESUME, A.RESTART_FREE),
    **{(phase, event): (to or phase, action)
       for phase in JUDGED for event, (to, action) in _JUDGED_ROWS.items()},
}  # fmt: skip
# What each waiting phase observes to make its event.
WAITS_FOR: dict[Phase, WaitsFor] = {
    P.PENDING_RECREATE: WaitsFor.CLOCK,
    P.AWAITING_CAPACITY: WaitsFor.CLOCK,
    P.PENDING_RESTART: WaitsFor.CLOCK_AND_NODE,
    P.AWAITING_DELETE: WaitsFor.OPERATION,
    P.AWAITING_CREATE: WaitsFor.OPERATION,
    P.AWAITING_QUEUED: WaitsFor.REQUEST,
    P.AWAITING_READY: WaitsFor.NODE,
    P.AWAITING_BOOTSTRAP: WaitsFor.BOOTSTRAP,
}
# Actions that open an incident (or continue the one open): the judged event names its kind.
OPENS = {A.OPEN_RECREATE, A.OPEN_REBUILD, A.OPEN_RESTART, A.RESTART_FREE, A.NOTE_NOTICE,
         A.NOTE_STATE, A.STOP, A.ROLL_OUT}  # fmt: skip


@dataclass(frozen=True)
class Transition:
    phase: Phase
    action: Action


@dataclass(frozen=True)
class Then:
    """What an action hands back when its outcome is known at once (a create refused, a delete
    not issued, a backoff already over): the event of the table's next row. `Watcher.on` takes
    it; no action applies a row itself."""

    event: Event
    detail: str = ""


def advance(phase: Phase, event: Event) -> Transition | None:
    """The row for (phase, event); None where the table has none (nothing happens)."""
    row = TABLE.get((phase, event))
    return Transition(*row) if row else None
