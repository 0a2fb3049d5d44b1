"""The recovery table's actions that ask for capacity (ops.watch.transitions): where the slice is
filed, what a refusal costs and where recovery turns next.

Each kind of refusal spends its own budget and backs off on its own (ops.watch.deadlines): a
stockout or a zone's quota sends the slice to the next zone of tpupod:zones, a region's quota
waits in place (every zone of tpupod:zones is in the one region). A request waiting past its
zone's patience keeps its place in that zone's queue: the next zone's is filed beside it, and
the first one filled wins. Before a request is filed, the requests recovery filed that are
FAILED or SUSPENDED are deleted: they cannot be filled, may hold quota, and one under the
node's id in this zone would block the new one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ops.cloud import queued as requests
from ops.watch.api import GiveUp, WatcherApi
from ops.watch.incident import Incident

# Requests that will never be filled and are deleted before filing again (DELETING is on its
# way; SUSPENDING becomes SUSPENDED).
UNFILLABLE = {"FAILED", "SUSPENDED"}


def queued(w: WatcherApi, inc: Incident, detail: str) -> None:
    inc.request_state, inc.request_since = None, 0.0  # a new request: its states timed afresh
    here = w.provider.zone
    beside = [z for z in inc.queued_zones if z != here]
    inc.queued_zones = [*beside, here]
    also = f" beside the one(s) waiting in {', '.join(beside)}" if beside else ""
    w.journal.event("queued", f"queued resource filed in {here}{also}: the node comes when "
                    "the zone has capacity", zone=here)  # fmt: skip


def file_beside(w: WatcherApi, inc: Incident, detail: str) -> None:
    """A request waited out its zone's patience: the next zone that holds no request of ours
    gets one too, filed at once (the next create), beside it; the waiting one keeps its place in
    its queue, and the first filled wins (`withdraw_others`)."""
    here, zones = w.provider.zone, w.provider.zones
    start = zones.index(here)
    there = next(z for z in zones[start + 1 :] + zones[:start] if z not in inc.queued_zones)
    w.provider.move_to(there)
    inc.zone, inc.not_before = there, time.time()
    w.journal.event("beside", f"{detail}; filing in {there} beside it: the request in {here} "
                    "keeps its place", zone=here, next_zone=there)  # fmt: skip


def keep_place(w: WatcherApi, inc: Incident, detail: str) -> None:
    """A create beside a waiting request was refused (quota permits no second request, or no
    capacity): no budget spent; the newest waiting request is followed again, and another zone
    is tried after its patience, from now."""
    here = w.provider.zone
    back = [z for z in inc.queued_zones if z != here][-1]
    w.provider.move_to(back)
    inc.zone, inc.request_state, inc.request_since = back, None, 0.0
    w.journal.event("kept_place", f"{detail}; the request in {back} keeps its place (another "
                    "zone is tried after its patience)", zone=here, next_zone=back)  # fmt: skip


def withdraw_others(w: WatcherApi, inc: Incident) -> None:
    """The first request filled wins: the incident's others are withdrawn (one line)."""
    winner = w.provider.zone
    others = [z for z in inc.queued_zones if z != winner]
    gone = [z for z in others if w.api(lambda z=z: w.provider.abandon_request(z)) is not None]
    inc.queued_zones = [winner, *(z for z in others if z not in gone)]
    if gone:
        w.journal.event("withdrawn", f"queued resource in {', '.join(gone)} withdrawn: the one in "
                        f"{winner} was filled first", zone=winner, zones=gone)  # fmt: skip


def stockout(w: WatcherApi, inc: Incident, detail: str) -> None:
    inc.stockouts += 1
    elsewhere(w, inc, detail, "stockout", inc.stockouts, w.config.capacity_retries,
              w.config.capacity_wait)  # fmt: skip


def quota(w: WatcherApi, inc: Incident, detail: str) -> None:
    """A zone's quota: the next zone has its own."""
    inc.quota_refusals += 1
    elsewhere(w, inc, detail, "quota", inc.quota_refusals, w.config.quota_retries,
              w.config.quota_wait)  # fmt: skip


def region_quota(w: WatcherApi, inc: Incident, detail: str) -> None:
    """A region's quota: no zone of tpupod:zones can help, so recovery backs off where it is."""
    inc.quota_refusals += 1
    elsewhere(w, inc, detail, "quota", inc.quota_refusals, w.config.quota_retries,
              w.config.quota_wait, move=False)  # fmt: skip


def request_failed(w: WatcherApi, inc: Incident, detail: str) -> None:
    """A queued resource FAILED, neither for capacity nor for quota: filed again after a
    backoff, on a small budget of its own; then recovery stops with the line naming the error."""
    inc.request_failures += 1
    count, budget, zone = inc.request_failures, w.config.request_failure_retries, w.provider.zone
    if count > budget:
        raise GiveUp(f"the queued resource in {zone} FAILED {count} times, not for capacity or "
                     f"quota (budget {budget}); last: {detail}")  # fmt: skip
    wait = w.config.retry_wait(count)
    inc.not_before = time.time() + wait
    w.journal.event("error", f"{detail}; filing it again in {wait:.0f}s ({count} of {budget})",
                    zone=zone, attempt=count)  # fmt: skip


def elsewhere(w: WatcherApi, inc: Incident, detail: str, kind: str, count: int,
              budget: int | None, wait_for: Callable[[int], float],
              move: bool = True) -> None:  # fmt: skip
    """A create refused here for capacity or quota: spend that kind's budget, withdraw a
    request still queued here, and try the next zone of tpupod:zones after its own backoff
    (a zone not refused yet in this incident at once; one zone, or not `move`: this one
    again, after this zone's backoff)."""
    if budget is not None and count > budget:
        raise GiveUp(f"gave up after {count} {kind} refusals (budget {budget}): {detail}")
    here = w.provider.zone
    inc.zone_tries[here] = inc.zone_tries.get(here, 0) + 1
    there = w.provider.next_zone() if move else here
    if w.provider.queued and w.api(w.provider.abandon_request) is None:
        there = here  # not withdrawn (a TPU API error): never leave a live request behind
    elif here in inc.queued_zones:
        inc.queued_zones.remove(here)
    w.provider.move_to(there)
    inc.zone = there
    wait = wait_for(inc.zone_tries.get(there, 0))
    inc.not_before = time.time() + wait
    where = f"trying {there}" if there != here else "creating again"
    w.journal.event(kind, f"{detail}; {where} in {wait:.0f}s", attempt=count, retry_in=wait,
                    zone=here, next_zone=there)  # fmt: skip


def sweep(w: WatcherApi, inc: Incident) -> None:
    """Before filing: delete every request of ours in tpupod:zones that can no longer be filled
    (one journal line each; a TPU API error leaves it for the next create); one still asking in
    another zone keeps its place (it joins the incident's: a watch restarted, a withdrawal
    that failed)."""
    for zone in w.provider.zones:
        status = w.api(lambda zone=zone: w.provider.request_status(zone))
        if status is None or status.state == requests.MISSING:
            continue
        asking = status.state not in requests.DEAD
        if asking and zone != w.provider.zone and zone not in inc.queued_zones:
            inc.queued_zones.append(zone)
        if status.state not in UNFILLABLE:
            continue
        if w.api(lambda zone=zone: w.provider.abandon_request(zone)) is None:
            continue
        if zone in inc.queued_zones:
            inc.queued_zones.remove(zone)
        why = f": {status.detail}" if status.detail else ""
        w.journal.event("withdrawn", f"queued resource in {zone} {status.state}{why}; deleted "
                        "before filing again", zone=zone, state=status.state)  # fmt: skip
