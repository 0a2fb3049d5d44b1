"""The local pod's queuedResources (localpod.gcp.tpu_queued), through Google's client and gcloud: a
request waits for capacity while stockouts last, provisions its node from the full node spec
(metadata included) and goes ACTIVE; a preemption leaves it SUSPENDED; it is deleted with its
node only with force; gcloud files, lists and describes one with no metadata at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2
from google.protobuf import duration_pb2

from localpod.pod import LocalPod

QR = tpu_v2.QueuedResource
STATE = tpu_v2.QueuedResourceState.State


def _states(tpu, name: str, until: STATE, timeout: float = 120.0) -> list[STATE]:
    """Every state seen (each once, in order) while polling until `until`."""
    seen: list[STATE] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = tpu.get_queued_resource(name=name).state.state
        if not seen or seen[-1] != state:
            seen.append(state)
        if state == until:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"{name} never reached {until.name}: {[s.name for s in seen]}")


def test_a_request_waits_for_capacity_goes_active_and_a_preemption_suspends_it(
    pod: LocalPod, tpu, parent, spec
) -> None:
    node_name = f"{parent}/nodes/local"
    tpu.delete_node(name=node_name).result(timeout=60)
    pod.inject_stockout(2)  # two tries find no capacity
    node = tpu_v2.Node.from_json(json.dumps(spec["node"]))
    request = QR(
        tpu=QR.Tpu(node_spec=[QR.Tpu.NodeSpec(parent=parent, node_id="local", node=node)]),
        spot=QR.Spot(),
        queueing_policy=QR.QueueingPolicy(valid_until_duration=duration_pb2.Duration(seconds=600)),
    )
    name = f"{parent}/queuedResources/qr1"
    filed = tpu.create_queued_resource(parent=parent, queued_resource_id="qr1",
                                       queued_resource=request)  # fmt: skip
    assert filed.result(timeout=30).name == name
    seen = _states(tpu, name, STATE.ACTIVE)
    assert STATE.WAITING_FOR_RESOURCES in seen and seen[-1] == STATE.ACTIVE, seen
    ready = tpu.get_node(name=node_name)
    assert ready.state == tpu_v2.Node.State.READY
    assert dict(ready.metadata) == dict(node.metadata)  # the full Node, metadata included
    assert ready.scheduling_config.spot  # the request's tier
    with pytest.raises(exceptions.Conflict, match="already exists"):  # 409 over REST
        tpu.create_queued_resource(parent=parent, queued_resource_id="qr1", queued_resource=request)

    pod.preempt(0)
    assert tpu.get_queued_resource(name=name).state.state == STATE.SUSPENDED
    with pytest.raises(exceptions.BadRequest, match="force"):  # FAILED_PRECONDITION: a node
        tpu.delete_queued_resource(name=name).result(timeout=30)
    tpu.delete_queued_resource(request={"name": name, "force": True}).result(timeout=60)
    assert list(tpu.list_queued_resources(parent=parent)) == []
    assert list(tpu.list_nodes(parent=parent)) == []
    with pytest.raises(exceptions.BadRequest, match="exactly one node"):
        tpu.create_queued_resource(parent=parent, queued_resource_id="qr2", queued_resource=QR(
            tpu=QR.Tpu(node_spec=[])))  # fmt: skip


def test_a_request_not_filled_in_time_fails(pod: LocalPod, tpu, parent, spec) -> None:
    """The pod has one slice: while a node holds it, a request waits for resources."""
    node = tpu_v2.Node.from_json(json.dumps(spec["node"]))
    tpu.create_node(parent=parent, node_id="local", node=node).result(timeout=120)
    request = QR(
        tpu=QR.Tpu(node_spec=[QR.Tpu.NodeSpec(parent=parent, node_id="other", node=node)]),
        queueing_policy=QR.QueueingPolicy(valid_until_duration=duration_pb2.Duration(seconds=2)),
    )
    name = f"{parent}/queuedResources/late"
    tpu.create_queued_resource(parent=parent, queued_resource_id="late",
                               queued_resource=request).result(timeout=30)  # fmt: skip
    seen = _states(tpu, name, STATE.FAILED, timeout=30)
    assert seen[0] == STATE.WAITING_FOR_RESOURCES, seen
    assert (
        "validUntilDuration" in tpu.get_queued_resource(name=name).state.failed_data.error.message
    )
    tpu.delete_queued_resource(name=name).result(timeout=30)
    tpu.delete_node(name=f"{parent}/nodes/local").result(timeout=60)


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="no gcloud CLI")
def test_gcloud_files_lists_and_describes_a_queued_resource(pod, endpoints, spec, tmp_path):
    env = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud")}

    def gcloud(*args: str) -> str:
        done = subprocess.run(["gcloud", *args], env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    gcloud("config", "set", "api_endpoint_overrides/tpu", endpoints["tpu_api"])
    gcloud("config", "set", "auth/access_token_file",
           endpoints["identities"]["operator"]["token_file"])  # fmt: skip
    gcloud("config", "set", "project", endpoints["project"])
    zone = ["--zone", endpoints["zone"]]
    gcloud("compute", "tpus", "queued-resources", "create", "byhand", "--node-id", "local",
           "--accelerator-type", spec["node"]["acceleratorType"], "--runtime-version",
           "tpu-ubuntu2204-base", "--spot", *zone)  # fmt: skip
    deadline = time.monotonic() + 120
    while (state := json.loads(gcloud("compute", "tpus", "queued-resources", "describe",
                                      "byhand", *zone, "--format=json"))["state"]["state"]) \
            != "ACTIVE":  # fmt: skip
        assert time.monotonic() < deadline, state
        time.sleep(0.5)
    listed = json.loads(gcloud("compute", "tpus", "queued-resources", "list", *zone,
                               "--format=json"))  # fmt: skip
    assert [q["name"].rsplit("/", 1)[1] for q in listed] == ["byhand"]
    node = json.loads(gcloud("compute", "tpus", "tpu-vm", "describe", "local", *zone,
                             "--format=json"))  # fmt: skip
    assert node["state"] == "READY" and not node.get("metadata")  # gcloud sent none
    gcloud("compute", "tpus", "queued-resources", "delete", "byhand", "--force", "--quiet", *zone)
    assert json.loads(gcloud("compute", "tpus", "queued-resources", "list", *zone,
                             "--format=json")) == []  # fmt: skip
