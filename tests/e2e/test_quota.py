"""Recovery under TPU quota, against the local TPU API's own quota (localpod.gcp.tpu_quota): a region's
quota is waited out where the slice is (no zone of the region can help) and named; the requests
recovery filed that can no longer be filled are deleted before it files again (they may hold
quota). A zone's quota sends the slice to the next zone: tests/e2e/test_provider.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from google.cloud import tpu_v2

from demo.reference import pod_provider
from localpod.pod import LocalPod
from ops.cloud.slice import SliceState
from ops.watch.transitions import Phase
from tests.e2e.test_capacity import other, watcher_for
from tests.e2e.test_provider import CONFIG, drive, phase_is

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
QUOTA = dataclasses.replace(CONFIG, quota_backoff=0.5)
REGION_QUOTA = "TPULocalCPUPreemptiblePerProjectPerRegionForTPUAPI"


def events(watcher, name: str) -> list[dict]:
    return [e for e in watcher.journal.events if e["event"] == name]


def test_a_regions_quota_is_waited_out_in_place_and_named(pod: LocalPod, tmp_path: Path) -> None:
    """Moving zones cannot help inside a region's quota: recovery says which quota, backs off and
    files again where it was (before: it moved to the next zone as for a zone's quota)."""
    provider = pod_provider(pod.paths.root)
    here = provider.describe().zone
    watcher = watcher_for(provider, tmp_path, "journal", QUOTA)
    pod.inject_quota(1, zone=here, scope="region")
    pod.preempt(notice=0)
    drive(watcher, phase_is(Phase.AWAITING_RESUME))
    watcher.close()
    quota = events(watcher, "quota")
    assert len(quota) == 1, [e["message"] for e in watcher.journal.events]
    assert REGION_QUOTA in quota[0]["message"] and "cannot help" in quota[0]["message"]
    assert (quota[0]["zone"], quota[0]["next_zone"]) == (here, here)
    assert quota[0]["retry_in"] > 0  # backed off, not filed again at once
    assert [e["zone"] for e in events(watcher, "recreated")] == [here]
    assert watcher.state.incident.quota_refusals == 1 and watcher.state.incident.stockouts == 0


def test_requests_that_cannot_be_filled_are_deleted_before_filing_again(
    pod_factory, tmp_path: Path
) -> None:
    """A FAILED request of recovery's (the node's id) left in the other zone holds the region's
    quota of one slice: recovery deletes it, one line, then files in its own zone with no quota
    refusal (before: the create was refused for quota, and the slice went looking elsewhere)."""
    local = pod_factory(quota_chips=4)  # one cpu-4 slice, spot
    local.up()
    provider = pod_provider(local.paths.root)
    here = provider.describe().zone
    there = other(here)
    local.answer_requests(fail="invalid", zone=there)
    node = tpu_v2.Node.from_json(json.dumps({**provider.target.spec["node"],
                                             "schedulingConfig": {}}))  # fmt: skip
    parent = f"projects/{provider.target.project}/locations/{there}"
    QR = tpu_v2.QueuedResource
    request = QR(tpu=QR.Tpu(node_spec=[QR.Tpu.NodeSpec(parent=parent, node_id="local",
                                                         node=node)]), spot=QR.Spot())  # fmt: skip
    local.set_quota()  # filed while the node is there; the limit holds from now on
    provider.client.create_queued_resource(parent=parent, queued_resource_id="local",
                                           queued_resource=request).result(timeout=30)  # fmt: skip
    local.set_quota(chips=4)
    assert provider.request_status(there).state == "FAILED"
    watcher = watcher_for(provider, tmp_path, "journal", QUOTA)
    local.preempt(notice=0)
    drive(watcher, phase_is(Phase.AWAITING_RESUME))
    watcher.close()
    names = [e["event"] for e in watcher.journal.events]
    withdrawn = events(watcher, "withdrawn")
    assert [(e["zone"], e["state"]) for e in withdrawn] == [(there, "FAILED")], names
    assert "bad request" in withdrawn[0]["message"]
    assert "quota" not in names and "stockout" not in names, names
    assert names.index("withdrawn") < names.index("queued")
    assert [e["zone"] for e in events(watcher, "recreated")] == [here]
    assert provider.request_status(there).state == "MISSING"
    assert provider.describe().state is SliceState.READY
