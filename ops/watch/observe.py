"""The waiting phases' observations: each looks at the one thing its phase waits for (a clock,
an operation, the node, the workers' bootstrap) and names the event (ops.watch.judge); None when
the TPU API did not answer (the same observation next poll)."""

from __future__ import annotations

import time
from collections.abc import Callable

from ops.cloud import queued
from ops.cloud.slice import SliceState
from ops.cloud.tpu_errors import failure_kind
from ops.watch import judge
from ops.watch.api import WatcherApi
from ops.watch.conditions import STATE_DEADLINES
from ops.watch.incident import Incident
from ops.watch.transitions import WAITS_FOR, Event, Phase, WaitsFor

Seen = tuple[Event, str] | None
# An operation just issued is looked at soon, then less often: the local cloud ends a delete in
# tens of milliseconds and the create waits on that look (half a poll of every recreate, on
# average); GCP's take minutes, where the looks slow down to the poll within two seconds (about
# ten more GETs of the operation). The other waits gate nothing: a node boots and runs its
# bootstrap without the watcher.
QUICK_LOOK_S, QUICK_LOOK_SHARE = 0.1, 0.25
QUICK_WAITS = {WaitsFor.OPERATION}


def quick_look(inc: Incident | None, now: float, poll: float) -> float | None:
    """Seconds to the next look while an open incident waits on an operation: a quarter of the
    time it has waited, at least QUICK_LOOK_S, at most the poll; None for every other phase."""
    if inc is None or not inc.open or WAITS_FOR.get(inc.phase) not in QUICK_WAITS:
        return None
    return min(poll, max(QUICK_LOOK_S, (now - inc.phase_since) * QUICK_LOOK_SHARE))


def clock(w: WatcherApi, inc: Incident, waited: float, deadline: float) -> Seen:
    return judge.clock_event(time.time(), inc.not_before), ""


def operation(w: WatcherApi, inc: Incident, waited: float, deadline: float) -> Seen:
    if inc.operation is None:  # no node to delete, or a create's name never saved
        return (Event.DONE if inc.phase is Phase.AWAITING_DELETE else Event.LOST), ""
    status = w.api(lambda: w.provider.operation(inc.operation))
    if status is None:
        return None
    event = judge.operation_event(status.done, status.error_code, status.stockout, waited,
                                  deadline)  # fmt: skip
    if status.done and status.refusal:  # a create refused after it began (Compute Engine's)
        event = judge.REFUSALS[status.refusal]
    if event is Event.DONE and inc.phase is Phase.AWAITING_CREATE and w.provider.queued:
        event = Event.QUEUED  # the request is filed; its node comes when capacity allows
    return event, status.error_message


def request(w: WatcherApi, inc: Incident, waited: float, deadline: float) -> Seen:
    """The incident's queued resources: the first one ACTIVE wins, wherever it is; else the
    newest (in the provider's zone) decides, timed per state (persisted: a restarted watch goes
    on). Zones whose older request is gone or dead leave the incident's list (the dead ones are
    deleted before the next filing: ops.watch.capacity.sweep)."""
    here = w.provider.zone
    zones = [z for z in inc.queued_zones if z != here] + [here]
    statuses = {}
    for zone in zones:
        status = w.api(lambda zone=zone: w.provider.request_status(zone))
        if status is None:
            return None
        statuses[zone] = status
    filled = next((z for z in zones if statuses[z].state == queued.FILLED), None)
    if filled is not None:
        w.provider.move_to(filled)  # the slice is where its request was filled
        return Event.DONE, f"queued resource in {filled} ACTIVE"
    inc.queued_zones = [z for z in zones if z == here or statuses[z].state not in queued.DEAD]
    spread = any(z not in inc.queued_zones for z in w.provider.zones)
    return newest(w, inc, statuses[here], spread)


def newest(w: WatcherApi, inc: Incident, status: queued.QueuedStatus, spread: bool) -> Seen:
    """The event of the newest request, in the provider's zone."""
    now, zone = time.time(), w.provider.zone
    first = status.state != inc.request_state
    if first:
        inc.request_state, inc.request_since = status.state, now
    in_state = now - inc.request_since
    limit = w.config.request_limit(status.state, spread)
    failure = failure_kind(status.code, status.detail) if status.state == queued.UNFILLED else ""
    event = judge.request_event(status.state, in_state, limit, first, failure or "stockout",
                                spread)  # fmt: skip
    detail = f"queued resource in {zone} {status.state}"
    if event is Event.UNKNOWN_STATE:
        return event, (f"queued resource in {zone}: {status.detail}; waiting up to "
                       f"{limit:.0f}s, then filing it again")  # fmt: skip
    if event in (Event.PATIENCE, Event.STOCKOUT) and status.state == queued.WAITING:
        detail = f"no capacity in {zone} yet: queued for {in_state:.0f}s (patience {limit:.0f}s)"
    elif event is Event.DEADLINE:
        detail = (
            f"queued resource in {zone} {status.state} for {in_state:.0f}s (limit {limit:.0f}s)"
        )
    return event, f"{detail}: {status.detail}" if status.detail else detail


def node(w: WatcherApi, inc: Incident, waited: float, deadline: float) -> Seen:
    """The node awaited READY; the time in its current state is kept on the incident (a state
    with a deadline of its own ends at that one, not the phase's 30 minutes)."""
    info = w.describe()
    if info is None:
        return None
    now = time.time()
    if info.state != inc.node_state:
        inc.node_state, inc.node_since = str(info.state), now
    in_state, limits = now - inc.node_since, w.config.limits
    event = judge.slice_event(info.state, waited, deadline, in_state, limits)
    own = STATE_DEADLINES.get(info.state)
    if event is Event.DEADLINE and own and waited <= deadline:
        limit = getattr(limits, own)
        return event, f"node {info.state} for {in_state:.0f}s (deadline {own}, {limit:.0f}s)"
    return event, f"node {info.state}"


def clock_and_node(w: WatcherApi, inc: Incident, waited: float, deadline: float) -> Seen:
    info = w.describe()
    if info is None:
        return None
    ready = info.state is SliceState.READY
    return (judge.clock_event(time.time(), inc.not_before) if ready else Event.GONE,
            f"node {info.state}")  # fmt: skip


def bootstrap(w: WatcherApi, inc: Incident, waited: float, deadline: float) -> Seen:
    info = w.describe()
    if info is None:
        return None
    boots = []
    if info.state is SliceState.READY:
        probes = w.workers(info.workers).probe()
        boots = [p.bootstrap_state if p.reachable else None for p in probes]
    return judge.bootstrap_event(info.state, boots, waited, deadline), f"node {info.state}"


OBSERVERS: dict[WaitsFor, Callable[[WatcherApi, Incident, float, float], Seen]] = {
    WaitsFor.CLOCK: clock,
    WaitsFor.OPERATION: operation,
    WaitsFor.REQUEST: request,
    WaitsFor.NODE: node,
    WaitsFor.CLOCK_AND_NODE: clock_and_node,
    WaitsFor.BOOTSTRAP: bootstrap,
}
