"""The local TPU API's chip quota (localpod.gcp.tpu_quota), through Google's client: per region and
per zone, spot and on-demand apart, nodes and queued requests in any state but deleted holding
it, and a create over it refused with HTTP 429 as Google refuses it (the quota named in the
message, a QuotaFailure per limit). The module's pod (conftest) has node `local` in local-a:
spot, `cpu-4`, 4 chips."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2

from localpod.pod import LocalPod

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
SPOT_REGION = "TPULocalCPUPreemptiblePerProjectPerRegionForTPUAPI"
SPOT_ZONE = "TPULocalCPUPreemptiblePerProjectPerZoneForTPUAPI"
QR = tpu_v2.QueuedResource


def _file(tpu, spec: dict, zone: str, request_id: str, spot: bool = True):
    """A queued request for the spec's node in `zone` (spot tier or on-demand), as gcloud files."""
    parent = f"projects/tpupod-local/locations/{zone}"
    node = tpu_v2.Node.from_json(json.dumps({**spec["node"], "schedulingConfig": {}}))
    request = QR(tpu=QR.Tpu(node_spec=[QR.Tpu.NodeSpec(parent=parent, node_id="other", node=node)]))
    if spot:
        request.spot = QR.Spot()
    operation = tpu.create_queued_resource(parent=parent, queued_resource_id=request_id,
                                           queued_resource=request)  # fmt: skip
    return operation.result(timeout=30)


def _refused(tpu, spec, zone: str, request_id: str) -> dict:
    with pytest.raises(exceptions.TooManyRequests) as refused:  # 429 over REST
        _file(tpu, spec, zone, request_id)
    return refused.value.response.json()["error"]


def _drop(tpu, zone: str, request_id: str) -> None:
    name = f"projects/tpupod-local/locations/{zone}/queuedResources/{request_id}"
    tpu.delete_queued_resource(request={"name": name, "force": True}).result(timeout=30)


def test_no_quota_by_default(pod: LocalPod, tpu, spec) -> None:
    """Today's pod: no limit unless one is set (the negative control of what follows)."""
    _file(tpu, spec, "local-b", "free")
    _drop(tpu, "local-b", "free")


def test_the_regions_quota_counts_the_node_and_refuses_as_google_does(pod, tpu, spec) -> None:
    pod.set_quota(chips=4)  # the node in local-a holds all 4
    try:
        error = _refused(tpu, spec, "local-b", "over")
        assert error["status"] == "RESOURCE_EXHAUSTED" and error["code"] == 429
        assert error["message"] == (
            f"Quota limit '{SPOT_REGION}' has been exceeded. Limit: 4 in region local."
        )
        assert error["details"] == [{
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [{"subject": "project:1234",
                            "description": f"Quota '{SPOT_REGION}' exhausted. Limit 4 in region local"}],
        }]  # fmt: skip
        _file(tpu, spec, "local-b", "on-demand", spot=False)  # on-demand has a quota of its own
        _drop(tpu, "local-b", "on-demand")
    finally:
        pod.set_quota()


def test_a_zones_quota_is_the_zones_own_and_both_are_named_together(pod, tpu, spec) -> None:
    pod.set_quota(zone_chips=4)
    try:
        _file(tpu, spec, "local-b", "elsewhere")  # local-b holds nothing yet: it waits there
        error = _refused(tpu, spec, "local-a", "here")
        assert f"'{SPOT_ZONE}'" in error["message"] and "in zone local-a" in error["message"]
        pod.set_quota(chips=8, zone_chips=4)  # the node and the request in local-b: 8 of 8
        error = _refused(tpu, spec, "local-a", "both")
        assert error["message"] == (
            f"Quota limit '{SPOT_REGION},{SPOT_ZONE}' has been exceeded. "
            "Limit: 8,4 in region local,zone local-a.")  # fmt: skip
        assert len(error["details"][0]["violations"]) == 2
    finally:
        pod.set_quota()
        _drop(tpu, "local-b", "elsewhere")


def test_a_failed_request_holds_quota_until_deleted(pod, tpu, spec) -> None:
    """Google does not say whether a FAILED request holds quota; the pod's reading is the
    stricter one: it does, until deleted."""
    pod.answer_requests(fail="invalid", zone="local-b")
    _file(tpu, spec, "local-b", "broken")
    state = tpu.get_queued_resource(
        name="projects/tpupod-local/locations/local-b/queuedResources/broken"
    ).state
    assert state.state == tpu_v2.QueuedResourceState.State.FAILED
    assert state.failed_data.error.code == 3 and "bad request" in state.failed_data.error.message
    pod.set_quota(chips=8)  # the node's 4 and the FAILED request's 4
    try:
        _refused(tpu, spec, "local-b", "next")
        _drop(tpu, "local-b", "broken")
        _file(tpu, spec, "local-b", "next")
        _drop(tpu, "local-b", "next")
    finally:
        pod.set_quota()


def test_an_injected_refusal_names_the_scope_asked_for(pod, tpu, spec) -> None:
    pod.inject_quota(1, zone="local-b", scope="region")
    error = _refused(tpu, spec, "local-b", "injected")
    assert error["message"].startswith(f"Quota limit '{SPOT_REGION}'"), error["message"]


@pytest.mark.parametrize("flag", ["--quota-chips", "--zone-quota-chips"])
def test_a_negative_quota_is_one_line(flag, tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "ops", "local", "up", flag, "-1", "--pod-dir",
                          str(tmp_path / "pod")], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)  # fmt: skip
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert flag in out.stderr and not (tmp_path / "pod").exists()


def test_each_generation_has_its_own_quota(pod, tpu, spec) -> None:
    """A v4-16 (2 hosts, as the pod's 2 workers play it: 8 chips) counts against v4's quota,
    not the pod's cpu-N node's: the region's limit of 4 refuses it for its own 8 chips."""
    pod.set_quota(chips=4)
    try:
        v4 = {**spec, "node": {**spec["node"], "acceleratorType": "v4-16"}}
        error = _refused(tpu, v4, "local-b", "v4")
        assert error["message"] == ("Quota limit 'TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI'"
                                    " has been exceeded. Limit: 4 in region local.")  # fmt: skip
    finally:
        pod.set_quota()


def _cli(pod: LocalPod, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops", "local", *args, "--pod-dir",
                           str(pod.paths.root)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)  # fmt: skip


def test_the_cli_answers_on_demand_and_clears(pod, tpu, parent) -> None:
    """`tpupod local answer` and `stockout --quota --region`, as an operator types them; `local
    status` reads a state the client cannot name without failing."""
    assert _cli(pod, "answer", "node", "--state", "99").returncode == 0
    assert tpu.get_node(name=f"{parent}/nodes/local").state == 99
    status = _cli(pod, "status")
    assert status.returncode == 0 and "99" in status.stdout, status.stderr
    bad = _cli(pod, "answer", "node")
    assert bad.returncode == 2 and "--state" in bad.stderr and bad.stderr.count("\n") == 1
    stockout = _cli(pod, "stockout", "--quota", "--region", "--zone", "local-b")
    assert stockout.returncode == 0 and "region" in stockout.stdout
    assert _cli(pod, "answer", "clear").returncode == 0  # the region's refusal goes too
    assert tpu.get_node(name=f"{parent}/nodes/local").state == tpu_v2.Node.State.READY
    _file(tpu, {"node": {"acceleratorType": "cpu-4", "runtimeVersion": "x"}}, "local-b", "after")
    _drop(tpu, "local-b", "after")
