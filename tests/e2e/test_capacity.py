"""Spot capacity as Google hands it out, against the local pod's Cloud TPU API: the slice comes
back through a queued resource that waits in the zone's queue, a SUSPENDED request is deleted
and filed anew, and a zone without capacity sends the slice to the next zone of tpupod:zones
(nodes.create's stockout at once, a queued request after its patience)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from localpod.demo.reference import pod_provider
from localpod.pod import LocalPod
from ops.journal import Journal
from ops.provider import SliceState
from ops.watch import Watcher
from ops.watch.incident import IncidentStore
from ops.watch.table import Phase
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
        if w.incident is not None and w.incident.phase is Phase.AWAITING_QUEUED:
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


def test_a_request_queued_too_long_in_one_zone_is_withdrawn_and_filed_in_the_next(
    pod_factory, tmp_path: Path
) -> None:
    local = pod_factory()
    local.up()
    provider = pod_provider(local.paths.root)
    here = provider.describe().zone
    config = dataclasses.replace(CONFIG, zone_patience=2.0)
    watcher = watcher_for(provider, tmp_path, "journal", config)
    local.inject_stockout(1000, zone=here)  # zone a stays full
    local.preempt(notice=0)
    drive(watcher, phase_is(Phase.AWAITING_RESUME))
    watcher.close()
    events = watcher.journal.events
    assert [e["zone"] for e in events if e["event"] == "queued"] == [here, other(here)]
    stockout = [e for e in events if e["event"] == "stockout"]
    assert len(stockout) == 1 and "queued for" in stockout[0]["message"]
    # the request left in zone a was withdrawn: node and request live in b alone
    assert [r.name.split("/")[3] for r in provider.client.list_queued_resources(
        parent=f"projects/{provider.target.project}/locations/-")] == [other(here)]  # fmt: skip
    assert provider.describe().zone == other(here)


def test_local_up_can_file_a_queued_resource_for_the_first_node(pod_factory) -> None:
    """`tpupod local up` (queue_first): the first node comes through a queued resource too, as a
    stack's recovery files them (pulumi up's first node is a V2Vm: nodes.create)."""
    local = pod_factory(queue_first=True)
    local.up()
    provider = pod_provider(local.paths.root)
    assert provider.request_status().state == "ACTIVE"
    assert provider.describe().state is SliceState.READY
