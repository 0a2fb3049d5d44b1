"""The local pod's Compute Engine API (issue 51), checked with Google's own clients: gcloud (with
`api_endpoint_overrides/compute` and the operator's token) and google-cloud-compute (what
ops.cloud.compute.ComputeProvider, recovery's provider on this path, calls). One 2-worker pod
made as a managed instance group for the module; tests run in file order, the last ones preempt
and recreate its slice."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1
from google.oauth2.credentials import Credentials

from localpod.gcp import identities
from localpod.pod import LocalPod
from ops.cloud.compute import ComputeProvider, make_clients
from ops.cloud.slice import SliceState
from ops.cloud.target import local_target

pytestmark = pytest.mark.e2e

STARTUP_SCRIPT = r"""#!/bin/bash
set -euo pipefail
mkdir -p "$TPUPOD_ROOT"
curl -sf -H 'Metadata-Flavor: Google' \
  "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/worker-id" \
  > "$TPUPOD_ROOT/booted"
"""


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPod]:
    script = tmp_path_factory.mktemp("script") / "startup.sh"
    script.write_text(STARTUP_SCRIPT)
    local_pod = LocalPod(tmp_path_factory.mktemp("pod"), workers=2, startup_script=script,
                         api="compute")  # fmt: skip
    try:
        local_pod.up()
        yield local_pod
    finally:
        local_pod.down()


@pytest.fixture(scope="module")
def endpoints(pod: LocalPod) -> dict:
    return pod.endpoints()


@pytest.fixture(scope="module")
def gcloud(endpoints: dict, tmp_path_factory: pytest.TempPathFactory):
    config = tmp_path_factory.mktemp("gcloud")
    env = {**os.environ, "CLOUDSDK_CONFIG": str(config), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}

    def run(*args: str, token: str | None = None) -> subprocess.CompletedProcess:
        file = config / "token"
        file.write_text(token or identities.operator_token(endpoints))
        return subprocess.run(["gcloud", *args, "--access-token-file", str(file)], env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    for key, value in (("api_endpoint_overrides/compute", endpoints["compute_api"]),
                       ("project", endpoints["project"])):  # fmt: skip
        subprocess.run(["gcloud", "config", "set", key, value], env=env, check=True,
                       capture_output=True, timeout=60)  # fmt: skip
    return run


def listed(gcloud, endpoints: dict) -> list[dict]:
    out = gcloud("compute", "instance-groups", "managed", "list-instances", endpoints["mig"],
                 "--zone", endpoints["zone"], "--format", "json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def provider(pod: LocalPod) -> ComputeProvider:
    return ComputeProvider(local_target(pod.paths.root))


def test_endpoints_name_the_group_and_its_workload_policy(endpoints) -> None:
    assert {"tpu_api", "zone", "node", "identities"} <= set(endpoints)
    assert endpoints["compute_api"].startswith("http://127.0.0.1:")
    assert endpoints["compute_api"].endswith("/")
    assert (endpoints["region"], endpoints["mig"]) == ("local", "local")
    assert endpoints["workload_policy"] == "local-topology"


def test_gcloud_lists_two_running_vms_and_describes_the_topology(gcloud, endpoints) -> None:
    vms = listed(gcloud, endpoints)
    assert [vm["instanceStatus"] for vm in vms] == ["RUNNING", "RUNNING"]
    assert all(vm["instance"].rsplit("/", 1)[1].startswith("local-") for vm in vms)
    out = gcloud("compute", "resource-policies", "describe", endpoints["workload_policy"],
                 "--region", endpoints["region"], "--format", "json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    policy = json.loads(out.stdout)["workloadPolicy"]
    assert policy == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    out = gcloud("compute", "instances", "list", "--zones", endpoints["zone"], "--format", "json")
    machines = {vm["machineType"].rsplit("/", 1)[1] for vm in json.loads(out.stdout)}
    assert machines == {"tpu7x-standard-4t"}


def test_each_vm_reads_its_index_as_worker_id(pod) -> None:
    for i in range(2):
        assert (pod.paths.tpupod_root(i) / "booted").read_text() == str(i)


def test_refusals_come_in_compute_engines_envelope(pod, endpoints, gcloud) -> None:
    """A missing group: 404 notFound; a worker deleting the group: 403 naming the permission; a
    group of another size or a recreate of one VM of a slice: 400 invalid."""
    url = (f"{endpoints['compute_api']}compute/v1/projects/{endpoints['project']}/zones/"
           f"{endpoints['zone']}/instanceGroupManagers/nothing")  # fmt: skip
    request = urllib.request.Request(url, headers={
        "Authorization": f"Bearer {identities.operator_token(endpoints)}"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    error = json.loads(raised.value.read())["error"]
    assert error["code"] == 404 and error["errors"][0]["reason"] == "notFound"
    assert "instanceGroupManagers/nothing' was not found" in error["message"]
    worker = Path(endpoints["identities"]["worker-0"]["token_file"]).read_text().strip()
    as_worker = compute_v1.InstanceGroupManagersClient(
        transport="rest", credentials=Credentials(token=worker),
        client_options={"api_endpoint": endpoints["compute_api"].rstrip("/")})  # fmt: skip
    with pytest.raises(exceptions.Forbidden, match="compute.instanceGroupManagers.delete"):
        as_worker.delete(project=endpoints["project"], zone=endpoints["zone"],
                         instance_group_manager=endpoints["mig"])  # fmt: skip
    groups = compute_v1.InstanceGroupManagersClient(
        transport="rest", credentials=Credentials(token=identities.operator_token(endpoints)),
        client_options={"api_endpoint": endpoints["compute_api"].rstrip("/")})  # fmt: skip
    spec = json.loads(Path(endpoints["spec_file"]).read_text())
    wrong = {**spec["manager"], "name": "other", "targetSize": 3}
    with pytest.raises(exceptions.BadRequest, match="targetSize"):
        groups.insert(project=endpoints["project"], zone=endpoints["zone"],
                      instance_group_manager_resource=compute_v1.InstanceGroupManager.from_json(
                          json.dumps(wrong)))  # fmt: skip
    one = listed(gcloud, endpoints)[0]["instance"]
    with pytest.raises(exceptions.BadRequest, match="recreated together"):
        groups.recreate_instances(
            project=endpoints["project"], zone=endpoints["zone"],
            instance_group_manager=endpoints["mig"],
            instance_group_managers_recreate_instances_request_resource={"instances": [one]})  # fmt: skip
    assert pod.describe().state is SliceState.READY  # nothing refused touched the slice


def test_a_preemption_leaves_the_vms_terminated_and_recovery_recreates_them(
    pod, endpoints, gcloud
) -> None:
    before = {vm["instance"] for vm in listed(gcloud, endpoints)}
    # The watch describes every few seconds: a VM's address and host key are read once.
    target = local_target(pod.paths.root)
    clients = make_clients(target)
    clients["instances"] = counted = Counting(clients["instances"])
    slice_provider = ComputeProvider(target, clients)
    old_keys = [w.host_key for w in slice_provider.describe().workers]
    assert all(old_keys) and counted.calls == {"get": 2, "get_guest_attributes": 2}
    assert [w.host_key for w in slice_provider.describe().workers] == old_keys
    assert counted.calls == {"get": 2, "get_guest_attributes": 2}  # nothing asked again
    pod.preempt(notice=0)
    assert [vm["instanceStatus"] for vm in listed(gcloud, endpoints)] == ["TERMINATED"] * 2
    info = slice_provider.describe()
    assert info.state is SliceState.PREEMPTED and info.spot, info.detail
    status = slice_provider.recreate(timeout=120, poll=0.2)
    assert status.done and not status.error_code, status
    vms = listed(gcloud, endpoints)
    assert [vm["instanceStatus"] for vm in vms] == ["RUNNING", "RUNNING"]
    assert not before & {vm["instance"] for vm in vms}  # a new group: new VMs
    workers = slice_provider.describe().workers
    assert [w.internal_ip for w in workers] == [w.host for w in pod.describe().workers]
    assert all(w.host_key and w.instance for w in workers)
    # the new VMs' keys were read (the kept ones were of VMs that are gone): SSH pins these
    assert not set(old_keys) & {w.host_key for w in workers}
    assert counted.calls == {"get": 4, "get_guest_attributes": 4}


class Counting:
    """A Google client with a count of the calls made through it (each made for real)."""

    def __init__(self, client) -> None:
        self.client, self.calls = client, Counter()

    def __getattr__(self, name: str):
        method = getattr(self.client, name)

        def call(*args, **kwargs):
            self.calls[name] += 1
            return method(*args, **kwargs)

        return call


def test_a_stockout_is_the_creates_outcome_and_the_next_zone_gets_the_slice(pod, endpoints):
    """Compute Engine tells a refused create on the group's VMs, after the insert is DONE: a
    region's quota, then a zone without capacity, each read as recovery's class of refusal
    (what ops.watch moves or backs off on), the refused group withdrawn each time."""
    slice_provider = provider(pod)
    pod.inject_quota(zone=endpoints["zone"], scope="region")
    status = slice_provider.recreate(timeout=120, poll=0.2)
    assert status.refusal == "region-quota" and not status.stockout, status
    assert "QUOTA_EXCEEDED: Quota 'TPU7X_CHIPS' exceeded" in status.error_message
    assert slice_provider.describe().state is SliceState.MISSING  # withdrawn
    pod.inject_stockout(zone=endpoints["zone"])
    status = slice_provider.recreate(timeout=120, poll=0.2)
    assert status.stockout and status.refusal == "stockout", status
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in status.error_message
    slice_provider.move_to(slice_provider.next_zone())
    status = slice_provider.recreate(timeout=120, poll=0.2)
    assert status.done and not status.error_code, status
    info = provider(pod).describe()  # a fresh provider finds the group in its new zone
    assert info.state is SliceState.READY and info.zone == "local-b"


def test_destroys_hook_removes_the_group_recovery_moved_not_the_declared_one(pod, endpoints):
    """The group's before_delete hook (infra.mig_slice, at `pulumi destroy --run-program`):
    a group recovery made in another of tpupod:zones is deleted; the declared zone's is left to
    Pulumi (the negative control: declared where the group is, nothing is deleted)."""
    import asyncio
    from types import SimpleNamespace

    from infra.mig_slice import before_delete

    slice_provider = provider(pod)
    assert [o.zone for o in slice_provider.owned()] == ["local-b"]  # moved by the last test
    groups = compute_v1.InstanceGroupManagersClient(
        transport="rest", credentials=Credentials(token=identities.operator_token(endpoints)),
        client_options={"api_endpoint": endpoints["compute_api"].rstrip("/")})  # fmt: skip
    said: list[str] = []
    hook = before_delete(endpoints["project"], ["local-a", "local-b"], endpoints["mig"],
                         client=lambda: groups, say=said.append)  # fmt: skip
    asyncio.run(hook(SimpleNamespace(old_inputs={"zone": "local-b"}, name="slice-group")))
    assert said == ["slice-group: nothing of the stack's was left in Compute Engine (outside "
                    "Pulumi's state)"]  # fmt: skip
    assert [o.zone for o in slice_provider.owned()] == ["local-b"]
    asyncio.run(hook(SimpleNamespace(old_inputs={"zone": "local-a"}, name="slice-group")))
    assert said[-1] == "slice-group: deleted instance group local in local-b (2 VMs)"
    assert slice_provider.owned() == [] and pod.describe().state is SliceState.MISSING
