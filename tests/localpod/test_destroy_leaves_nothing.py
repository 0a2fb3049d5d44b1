"""Nothing of the stack bills after destroy (issue 48, item 4), on a 2-worker pod whose zones are
local-a and local-b: recovery (ops' own provider) moved the slice to local-b and left a FAILED
request in local-a. `tpupod status --all` lists both and the node; the slice's before_delete hook
(its function, called as the engine would: under mocks hooks are never called) leaves nothing of
the stack in any zone; requests and nodes of anyone else stay (the negative controls); `tpupod
local down` deletes the stack's slice through the TPU API and says so. A refusal is one line."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pulumi
import pytest
from google.cloud import tpu_v2
from google.oauth2.credentials import Credentials
from google.protobuf import duration_pb2

from infra import cleanup
from infra.tpu_slice import before_delete
from localpod.gcp import identities
from localpod.pod import LocalPod
from localpod.vm.metadata_server import ZONES
from ops.cli import main
from ops.cloud.target import local_target
from ops.cloud.tpu import TpuProvider

pytestmark = pytest.mark.e2e
QR = tpu_v2.QueuedResource
STACK = "local"  # the pod's stack: its node spec's tpupod-stack label
FOREIGN = {"someone-else": {"tpupod-stack": "other"}, "unlabelled": {}}


def _until(what, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s"
        time.sleep(0.1)
    return found


def _wait(provider: TpuProvider, name: str | None) -> None:
    _until(f"operation {name}", lambda: name is None or provider.operation(name).done)


def _failed_foreign_request(tpu, parent: str, request_id: str, labels: dict, spec: dict) -> None:
    """A request of someone else's (its node without our labels), left FAILED: it waits while our
    slice holds the pod's capacity and expires after 1 s."""
    node = tpu_v2.Node.from_json(json.dumps({**spec["node"], "labels": labels}))
    request = QR(
        tpu=QR.Tpu(node_spec=[QR.Tpu.NodeSpec(parent=parent, node_id=request_id, node=node)]),
        queueing_policy=QR.QueueingPolicy(valid_until_duration=duration_pb2.Duration(seconds=1)),
    )
    tpu.create_queued_resource(parent=parent, queued_resource_id=request_id,
                               queued_resource=request).result(timeout=30)  # fmt: skip
    name = f"{parent}/queuedResources/{request_id}"
    failed = tpu_v2.QueuedResourceState.State.FAILED
    _until(f"{name} FAILED", lambda: tpu.get_queued_resource(name=name).state.state == failed)


def _everything(tpu, project: str) -> dict[str, list[str]]:
    """Every node and request the pod's TPU API lists, in every zone, by zone/id."""
    found: dict[str, list[str]] = {"nodes": [], "queued": []}
    for zone in ZONES:
        parent = f"projects/{project}/locations/{zone}"
        found["nodes"] += [
            f"{zone}/{n.name.rsplit('/', 1)[1]}" for n in tpu.list_nodes(parent=parent)
        ]
        found["queued"] += [f"{zone}/{q.name.rsplit('/', 1)[1]}"
                            for q in tpu.list_queued_resources(parent=parent)]  # fmt: skip
    return found


@pytest.fixture(scope="module")
def moved(pod: LocalPod, tpu, spec, endpoints) -> TpuProvider:
    """The slice `up` made in local-a (Pulumi's node) is gone; recovery's request in local-b is
    ACTIVE (its node READY there), its request in local-a FAILED (never withdrawn: the watch was
    stopped before it could); two FAILED requests of someone else's sit in local-a and local-b."""
    capacity = {"via": "queued", "zones": list(ZONES), "valid_for_s": 1}
    target = local_target(pod.paths.root)
    provider = TpuProvider(dataclasses.replace(target, spec={**target.spec, "capacity": capacity}))
    _wait(provider, provider.start_delete())  # node `local` in local-a
    provider.move_to("local-b")
    _wait(provider, provider.start_create(attempt=2))
    _until("the slice READY in local-b", lambda: provider.request_status().state == "ACTIVE")
    provider.move_to("local-a")  # the slice is taken: this request waits, then expires
    _wait(provider, provider.start_create(attempt=3))
    _until("the request FAILED in local-a", lambda: provider.request_status().state == "FAILED")
    for (request_id, labels), zone in zip(FOREIGN.items(), ZONES, strict=True):
        _failed_foreign_request(tpu, f"projects/{endpoints['project']}/locations/{zone}",
                                request_id, labels, spec)  # fmt: skip
    return provider


def test_status_all_lists_what_the_stack_owns_in_every_zone(moved, pod, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich: one row per line
    assert main(["status", "--all", "--stack", STACK, "--pod-dir", str(pod.paths.root)]) == 0
    out = capsys.readouterr().out
    rows = [" ".join(line.replace("│", " ").split()) for line in out.splitlines()]
    run = pod.run_id
    assert f"queued resource local-a local FAILED {run}" in rows, out
    assert f"queued resource local-b local ACTIVE {run}" in rows, out
    assert f"node local-b local READY {run}" in rows, out
    assert "stack local owns 3 TPU resource(s) in local-a, local-b" in out
    assert not any(name in out for name in FOREIGN)  # the negative control: not ours


def test_the_delete_hook_leaves_nothing_of_the_stack_in_any_zone(moved, tpu, endpoints):
    project = endpoints["project"]
    assert len(cleanup.list_owned(tpu, project, ZONES, STACK)) == 3
    said: list[str] = []
    # The stack's zones are local-b alone now; the node was declared in local-a (the hook's old
    # inputs): the hook cleans both.
    hook = before_delete(project, ["local-b"], STACK, client=lambda: tpu, say=said.append)
    args = pulumi.ResourceHookArgs(
        urn="urn:pulumi:local::tpupod::tpupod:infra:TpuSlice$gcp:tpu/v2Vm:V2Vm::slice-node",
        id=f"projects/{project}/locations/local-a/nodes/local", name="slice-node",
        type="gcp:tpu/v2Vm:V2Vm", old_inputs={"zone": "local-a"}, old_outputs={},
    )  # fmt: skip
    asyncio.run(hook(args))
    assert cleanup.list_owned(tpu, project, ZONES, STACK) == []
    left = {"nodes": [], "queued": ["local-a/someone-else", "local-b/unlabelled"]}
    assert _everything(tpu, project) == left  # someone else's requests stay
    run = moved.target.metadata["tpupod-run-id"]
    assert sorted(said) == [  # the node went with its request (force): no delete of its own
        f"slice-node: deleted queued resource local in local-a (FAILED, run {run})",
        f"slice-node: deleted queued resource local in local-b (ACTIVE, run {run})",
    ]


def test_a_node_of_another_stack_is_left_alone(pod, tpu, spec, endpoints):
    """The negative control for nodes: only one slice fits the pod, so it stands alone."""
    parent = spec["parent"]
    node = tpu_v2.Node.from_json(json.dumps({**spec["node"], "labels": {"tpupod-stack": "other"}}))
    tpu.create_node(parent=parent, node_id="theirs", node=node).result(timeout=120)
    try:
        removal = cleanup.remove_owned(tpu, endpoints["project"], ZONES, STACK, timeout_s=60)
        assert removal.deleted == ()
        assert removal.lines() == ["nothing of the stack's was left in the TPU API"]
        assert [n.name for n in tpu.list_nodes(parent=parent)] == [f"{parent}/nodes/theirs"]
    finally:
        tpu.delete_node(name=f"{parent}/nodes/theirs").result(timeout=60)


def test_a_refusal_is_one_line(pod, endpoints):
    """A worker's service account may not list the project's TPU nodes: 403, one line."""
    worker = tpu_v2.TpuClient(
        transport="rest",
        credentials=Credentials(token=identities.token(endpoints, "worker-0")),
        client_options={"api_endpoint": endpoints["tpu_api"].rstrip("/")},
    )
    with pytest.raises(cleanup.CleanupError) as refused:
        cleanup.remove_owned(worker, endpoints["project"], ZONES, STACK, timeout_s=30)
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(
        "cannot list queued resources in projects/tpupod-local/locations/local-a: 403"
    )
    assert "tpu.nodes.list" in line and "roles/tpu.admin" in line


def test_local_down_deletes_the_stacks_slice_then_stops_the_pod(pod, tpu, endpoints, capsys):
    pod.create(wait=True)  # the slice again, in local-a (as `tpupod local up` made it)
    assert main(["local", "down", "--pod-dir", str(pod.paths.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"deleted node local in local-a (READY, run {pod.run_id})",
        f"local pod in {pod.paths.root} is down",
    ]
    assert not pod.is_up()
