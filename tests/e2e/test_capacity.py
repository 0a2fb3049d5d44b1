"""Spot capacity as Google hands it out, against the local pod's Cloud TPU API: the slice comes
back through a queued resource that waits in the zone's queue, a SUSPENDED request is deleted
and filed anew, and a zone without capacity sends the slice to the next zone of tpupod:zones
(nodes.create's stockout at once, a queued request after its patience)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from demo.reference import pod_provider
from localpod.pod import LocalPod
from ops.cloud.slice import SliceState
from ops.watch import Watcher
from ops.watch.incident import IncidentStore
from ops.watch.journal import Journal
from ops.watch.transitions import Phase
from tests.e2e.test_provider import CONFIG, direct, drive, phase_is

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def other(zone: str) -> str:
    return "local-b" if zone == "local-a" else "local-a"


def watcher_for(provider, tmp_path: Path, name: str, config=CONFIG) -> Watcher:
    journal = Journal(tmp_path / f"{name}.jsonl")
    return Watcher(provider, journal, config, store=IncidentStore(tmp_path / f"{name}.json"))


def test_a_queued_resource_waits_for_capacity_and_a_suspended_one_is_filed_again(
    pod: LocalPod, tmp_path: Path
) -> None:
    provider = pod_provider(pod.paths.root)
    assert provider.queued  # the pod's spec asks for queued resources, as a stack does
    zone = provider.describe().zone
    provider.zones = [zone]  # one zone: the request waits in its queue, however long
    first = watcher_for(provider, tmp_path, "first")
    pod.inject_stockout(2, zone=zone)
    pod.preempt(notice=0)
    seen: list[str] = []

    def resumed_after_waiting(w: Watcher) -> bool:
        if w.state.incident is not None and w.state.incident.phase is Phase.AWAITING_QUEUED:
            seen.append(provider.request_status().state)
        return phase_is(Phase.AWAITING_RESUME)(w)

    drive(first, resumed_after_waiting)
    first.close()
    assert "WAITING_FOR_RESOURCES" in seen, seen
    assert provider.request_status().state == "ACTIVE"
    assert pod.inject_stockout(0, zone=zone) == 0  # both stockouts were spent in the queue
    names = [e["event"] for e in first.journal.events]
    assert names.count("queued") == 1 and "stockout" not in names, names
    node_id = provider.client.get_node(name=provider.node_name).id

    # The request's node preempted: the request is SUSPENDED and cannot be allocated again.
    pod.preempt(notice=0)
    assert provider.request_status().state == "SUSPENDED"
    second = watcher_for(provider, tmp_path, "second")
    drive(second, phase_is(Phase.AWAITING_RESUME))
    second.close()
    assert provider.request_status().state == "ACTIVE"
    assert provider.client.get_node(name=provider.node_name).id != node_id
    names = [e["event"] for e in second.journal.events]
    assert names.count("queued") == names.count("recreated") == 1, names


def test_a_stockout_in_one_zone_brings_the_slice_back_in_the_next(
    pod_factory, tmp_path: Path
) -> None:
    """nodes.create: zone a has no capacity for the next 3 creates, zone b has some: the first
    refusal sends the slice to b at once (a zone not refused yet waits for nothing), and the
    workers are reached there (the IAP stand-in looks the instance up in b)."""
    local = pod_factory()
    local.up()
    provider = direct(pod_provider(local.paths.root))
    here = provider.describe().zone
    watcher = watcher_for(provider, tmp_path, "journal")
    local.inject_stockout(3, zone=here)
    local.preempt(notice=0)
    drive(watcher, phase_is(Phase.AWAITING_RESUME))
    watcher.close()
    stockouts = [e for e in watcher.journal.events if e["event"] == "stockout"]
    assert len(stockouts) == 1, [e["message"] for e in watcher.journal.events]
    assert (stockouts[0]["zone"], stockouts[0]["next_zone"]) == (here, other(here))
    assert stockouts[0]["retry_in"] == 0
    recreated = [e for e in watcher.journal.events if e["event"] == "recreated"]
    assert [e["zone"] for e in recreated] == [other(here)]
    info = pod_provider(local.paths.root).describe()  # found in b by a fresh provider
    assert (info.state, info.zone, len(info.workers)) == (SliceState.READY, other(here), 2)
    assert local.inject_stockout(0, zone=here) == 2  # zone a was asked once


def requests_by_zone(provider) -> set[str]:
    """The zones holding a queued resource of the project now."""
    parent = f"projects/{provider.target.project}/locations/-"
    return {r.name.split("/")[3] for r in provider.client.list_queued_resources(parent=parent)}


def beside(local: LocalPod, tmp_path: Path, stockouts: dict[str, int], patience: float = 1.5):
    """Preempt the slice with `stockouts` pending per zone (one spent per second a request
    waits there), and watch it back with the zones' patience, noting the zones that hold a
    request at every poll."""
    provider = pod_provider(local.paths.root)
    here = provider.describe().zone
    config = dataclasses.replace(CONFIG, zone_patience=patience, quota_backoff=0.5)
    watcher = watcher_for(provider, tmp_path, "journal", config)
    for zone, count in stockouts.items():  # "here" or "there"
        local.inject_stockout(count, zone={"here": here, "there": other(here)}[zone])
    local.preempt(notice=0)
    held: list[set[str]] = []

    def resumed(w: Watcher) -> bool:
        held.append(requests_by_zone(provider))
        return phase_is(Phase.AWAITING_RESUME)(w)

    drive(watcher, resumed)
    watcher.close()
    return watcher, here, held, provider


def test_a_request_queued_past_its_patience_keeps_its_place_and_the_next_zone_is_filed_beside(
    pod_factory, tmp_path: Path
) -> None:
    """Zone a stays full: past the zone's patience zone b's request is filed beside a's (a's is
    not withdrawn: it keeps its place in a's queue), b's is filled first, and a's is withdrawn
    then (before: a's was deleted to file b's instead)."""
    local = pod_factory()
    local.up()
    watcher, here, held, provider = beside(local, tmp_path, {"here": 1000})
    events = watcher.journal.events
    assert [e["zone"] for e in events if e["event"] == "queued"] == [here, other(here)]
    assert {here, other(here)} in held  # both asked at once
    assert [e["event"] for e in events].count("beside") == 1
    withdrawn = [e for e in events if e["event"] == "withdrawn"]
    assert [e["zones"] for e in withdrawn] == [[here]]
    assert "stockout" not in [e["event"] for e in events]
    assert requests_by_zone(provider) == {other(here)}
    assert provider.describe().zone == other(here)


def test_the_first_request_filled_wins_even_the_older_one(pod_factory, tmp_path: Path) -> None:
    """Zone a fills a few seconds in, after b's request was filed beside it; b stays full: the
    slice comes back in a and b's request is withdrawn (before: a's had been withdrawn, and b's
    waited for capacity that never came)."""
    local = pod_factory()
    local.up()
    watcher, here, held, provider = beside(local, tmp_path, {"here": 6, "there": 1000})
    events = watcher.journal.events
    assert {here, other(here)} in held
    assert [e["zone"] for e in events if e["event"] == "recreated"] == [here]
    assert [e["zones"] for e in events if e["event"] == "withdrawn"] == [[other(here)]]
    assert requests_by_zone(provider) == {here}


def test_a_request_is_filed_beside_only_as_quota_permits(pod_factory, tmp_path: Path) -> None:
    """The region's quota holds one slice, which the waiting request in a takes: the request
    beside it in b is refused for quota, no budget is spent, and a's keeps its place until
    filled (before: a's was withdrawn to file in b)."""
    local = pod_factory(quota_chips=4)
    local.up()
    watcher, here, held, provider = beside(local, tmp_path, {"here": 6})
    events = watcher.journal.events
    kept = [e for e in events if e["event"] == "kept_place"]
    assert kept and "PerRegionForTPUAPI" in kept[0]["message"], [e["message"] for e in events]
    assert all(e["next_zone"] == here for e in kept)
    names = [e["event"] for e in events]
    assert "quota" not in names and "withdrawn" not in names and "gave_up" not in names
    assert all(zones <= {here} for zones in held)  # never a second request: quota
    assert [e["zone"] for e in events if e["event"] == "recreated"] == [here]
    assert watcher.state.incident.quota_refusals == 0


def test_local_up_can_file_a_queued_resource_for_the_first_node(pod_factory) -> None:
    """`tpupod local up` (queue_first): the first node comes through a queued resource too, as a
    stack's recovery files them (pulumi up's first node is a V2Vm: nodes.create)."""
    local = pod_factory(queue_first=True)
    local.up()
    provider = pod_provider(local.paths.root)
    assert provider.request_status().state == "ACTIVE"
    assert provider.describe().state is SliceState.READY
