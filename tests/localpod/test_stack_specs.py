"""Every stack's exported node spec creates a working node on the local pod (issue 14).

For each stack, `node_spec` is evaluated under Pulumi's mocks (in the pod's project) and sent AS
EXPORTED through google-cloud-tpu (REST, the operator's token) to a local pod with one worker per
host of the stack's accelerator type, whose cloud enforces that same stack's IAM (its service
accounts, grants and enabled APIs, as `pulumi up` would leave them: localpod.gcp.iam_policy) and whose
bucket is the stack's. The bucket is given the code bundle the spec names with
google-cloud-storage (infra.bundle_archive's bytes, whose sha256 must be the spec's
`tpupod-bundle-sha256`). The workers then run the spec's own `startup-script`, the real
bootstrap/startup.sh, as the stack's worker service account, and it must reach state "ok" on every
worker: the spec's metadata keys, bucket, bundle and grants work, and its trainer starts.

Two metadata values of the request are overridden, because the workers are CPU processes on a
2-core, 24 GiB machine; nothing else of the exported node changes:
- `tpupod-job` becomes the built-in trainer's job with `--config tiny --steps 2`: the stacks'
  presets (350m, 1b) would have every worker allocate gigabytes. Deleting the node the moment
  bootstrap is ok would only race the job's start; the override bounds memory whatever the
  timing. (The bundle stays the stack's: its `job/` holds the stack's own job file.)
- `tpupod-uv-group` `tpu` becomes empty: that group adds only libtpu, the TPU runtime (213 MB,
  useless on a CPU worker); the pod's own nodes leave it out the same way
  (localpod.vm.environment.pod_metadata). The spec's bucket gets the session's environments, as
  the pod's own bucket does (localpod.env_seed), so workers install from it.
The node is deleted as soon as every worker's bootstrap is ok.

Parent: Google's API refuses a create in a project the caller has no rights on, and this pod is
one project and zone (Contract 1). The test re-parents the request to the pod's zone and keeps
node_id and the node body as exported; it checks that another project is refused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import storage, tpu_v2
from google.oauth2.credentials import Credentials

from contract import metadata as keys
from infra import catalog, offline
from infra.builtin_job import builtin
from infra.bundle_archive import Bundle, build_bundle
from infra.config import parse, raw_from_config_map
from localpod import env_seed
from localpod.gcp.identities import operator_token
from localpod.gcp.tpu_client import client
from localpod.pod import LocalPod
from localpod.state import PodError
from localpod.vm.metadata_server import PROJECT_ID

pytestmark = pytest.mark.e2e

CPU_OVERRIDES = {keys.JOB: builtin("--config tiny --steps 2").spec.to_json(), keys.UV_GROUP: ""}
BOOTSTRAP_TIMEOUT_S = 420.0
# A no-op boot for the node the pod's own `up` creates; it is deleted before the stack's node.
IDLE_SCRIPT = "#!/bin/bash\ntrue\n"


def hosts_of(spec: dict) -> int:
    return catalog.lookup(spec["node"]["acceleratorType"]).hosts


def by_hosts() -> list:
    """Stacks ordered by host count (from their stack files), so one pod of each size serves
    its stacks in turn. Those of more than 2 hosts are `slow`: each of their cold workers
    installs the trainer's environment (707 MB unpacked) on this 2-core machine."""
    hosts = {
        stack: catalog.lookup(offline.stack_config(stack)["tpupod:acceleratorType"]).hosts
        for stack in offline.stack_names(api="tpu")  # a Compute Engine spec: no TPU API node
    }
    return [
        pytest.param(stack, marks=pytest.mark.slow) if hosts[stack] > 2 else stack
        for stack in sorted(hosts, key=lambda stack: (hosts[stack], stack))
    ]


def variants(stack: str) -> list[dict]:
    """The stack's spec under other settings a stack file may carry: a network given as a self
    link (exported as full resource paths) and every other provisioning model."""
    network = {
        "tpupod:existingNetwork": "https://www.googleapis.com/compute/v1/"
        "projects/p/global/networks/n",
        "tpupod:existingSubnet": "projects/p/regions/r/subnetworks/s",
    }
    configs = [network] + [
        {"tpupod:provisioning": p} for p in ("preemptible", "reserved", "on-demand")
    ]
    return [exported(stack, **c) for c in configs]


def exported(stack: str, **config: str) -> dict:
    """The stack's node spec as `pulumi up` exports it in the pod's project."""
    base = offline.stack_config(stack, project=PROJECT_ID)
    return offline.evaluate(stack, {**base, **config}).values["node_spec"]


class Pods:
    """One local pod at a time, for one stack (its size, IAM and bucket); the previous one goes
    down first."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.current: LocalPod | None = None

    def for_stack(self, stack: str, workers: int, bucket: str) -> LocalPod:
        self.down()
        self.current = LocalPod(self.root / f"pod-{stack}", workers=workers,
                                startup_script=IDLE_SCRIPT, stack=stack, bucket=bucket,
                                iam_stack=stack)  # fmt: skip
        self.current.up()
        self.current.delete(wait=True)  # the pod's own node: the stack's node replaces it
        return self.current

    def down(self) -> None:
        if self.current is not None:
            self.current.down()
            self.current = None


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pods]:
    made = Pods(tmp_path_factory.mktemp("stack-pods"))
    try:
        yield made
    finally:
        made.down()


def upload_bundle(endpoints: dict, node_metadata: dict, bundle: Bundle) -> None:
    """The spec's bucket and bundle object, through the emulator with Google's storage client."""
    assert node_metadata[keys.BUNDLE_SHA256] == bundle.sha256
    assert node_metadata[keys.BUNDLE_OBJECT] == bundle.object_name
    token = operator_token(endpoints)
    gcs = storage.Client(
        project=endpoints["project"],
        credentials=Credentials(token=token),
        client_options={"api_endpoint": endpoints["storage"]},
    )
    bucket = gcs.bucket(node_metadata[keys.BUCKET])  # the pod's: the stack's own bucket
    bucket.blob(bundle.object_name).upload_from_string(bundle.data, "application/gzip")
    # The session's environments (tests/conftest.py), under the stack's own envs/ prefix.
    env_seed.plant(endpoints["storage"], bucket.name, stack=node_metadata[keys.STACK],
                   token=token)  # fmt: skip


def wait_bootstrapped(pod: LocalPod, workers: int) -> None:
    """Until bootstrap.json says ok on every worker; fails fast with the phase and log tail."""
    deadline = time.monotonic() + BOOTSTRAP_TIMEOUT_S
    pending = set(range(workers))
    while pending:
        for index in sorted(pending):
            root = pod.paths.tpupod_root(index)
            try:
                state = json.loads((root / "bootstrap.json").read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            log = root / "bootstrap.log"
            tail = log.read_text().splitlines()[-5:] if log.exists() else []
            assert state.get("state") != "failed", f"worker {index}: {state} {tail}"
            if state.get("state") == "ok":
                pending.discard(index)
        assert time.monotonic() < deadline, f"workers {sorted(pending)} not bootstrapped"
        time.sleep(1.0)


def refusals(tpu: tpu_v2.TpuClient, spec: dict, parent: str, workers: int) -> None:
    """What Google's API refuses is refused here too, before any node is touched."""
    node = tpu_v2.Node.from_json(json.dumps(spec["node"]))
    # api_core's REST path raises Forbidden for any 403, against Google as here.
    elsewhere = parent.replace(f"projects/{PROJECT_ID}/", "projects/tpupod-test-project/")
    with pytest.raises(exceptions.Forbidden) as foreign:
        tpu.create_node(parent=elsewhere, node_id=spec["node_id"], node=node)
    assert foreign.value.response.json()["error"]["status"] == "PERMISSION_DENIED"
    wrong = "v4-32" if workers == 1 else "v4-8"  # a real type of another size
    other = catalog.lookup(wrong).hosts
    node.accelerator_type = wrong
    with pytest.raises(exceptions.BadRequest) as refused:
        tpu.create_node(parent=parent, node_id=spec["node_id"], node=node)
    message = refused.value.message
    assert "acceleratorType" in message and f"tpupod local up --workers {other}" in message
    assert "\n" not in message
    node.accelerator_type = "v5e-16"  # the user-facing name; the API's is v5litepod-16
    with pytest.raises(exceptions.BadRequest):
        tpu.create_node(parent=parent, node_id=spec["node_id"], node=node)


def accepted(tpu: tpu_v2.TpuClient, spec: dict, parent: str) -> None:
    """While the node exists, a create of `spec` passes the API's field checks (made first) and
    is refused only as ALREADY_EXISTS."""
    node = tpu_v2.Node.from_json(json.dumps(spec["node"]))
    with pytest.raises(exceptions.Conflict) as exists:
        tpu.create_node(parent=parent, node_id=spec["node_id"], node=node)
    assert exists.value.response.json()["error"]["status"] == "ALREADY_EXISTS"


def as_json(node: tpu_v2.Node) -> dict:
    return json.loads(tpu_v2.Node.to_json(node))


@pytest.mark.parametrize("stack", by_hosts())
def test_stack_spec_creates_a_working_node(stack: str, pods: Pods) -> None:
    # The bundle, then the spec naming it, right away: the tree may change while tests run.
    config = parse(raw_from_config_map(offline.stack_config(stack)), stack=stack)
    bundle = build_bundle(job=config.job_definition())
    spec = exported(stack)
    workers = hosts_of(spec)
    tpu_v2.Node.from_json(json.dumps(spec["node"]))  # Google's client takes it as exported
    pod = pods.for_stack(stack, workers, spec["node"]["metadata"][keys.BUCKET])
    endpoints = pod.endpoints()
    parent = f"projects/{endpoints['project']}/locations/{endpoints['zone']}"
    tpu = client(endpoints)
    refusals(tpu, spec, parent, workers)

    body = dict(spec["node"])
    assert set(CPU_OVERRIDES) <= set(body["metadata"])
    body["metadata"] = {**body["metadata"], **CPU_OVERRIDES}
    node = tpu_v2.Node.from_json(json.dumps(body))
    upload_bundle(endpoints, body["metadata"], bundle)
    name = f"{parent}/nodes/{spec['node_id']}"
    try:
        ready = tpu.create_node(parent=parent, node_id=spec["node_id"], node=node).result(
            timeout=180
        )
        assert ready.state == tpu_v2.Node.State.READY and ready.name == name
        got, sent = as_json(tpu.get_node(name=name)), as_json(node)
        for field in spec["node"]:  # every field the stack declared comes back as sent
            assert got.get(field) == sent.get(field), field
        assert got["acceleratorType"] == spec["node"]["acceleratorType"]
        assert len(got["networkEndpoints"]) == workers
        for variant in variants(stack):
            accepted(tpu, variant, parent)
        wait_bootstrapped(pod, workers)
    finally:
        try:
            if pod.describe().state != "MISSING":
                pod.delete(wait=True, timeout=120)
        except PodError:  # still creating, say: the whole pod goes instead
            pods.down()
