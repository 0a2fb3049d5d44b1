"""The local pod's Cloud TPU v2 API, checked with Google's own clients (google-cloud-tpu over
REST, the gcloud CLI) and real SSH against the workers it boots. Tests run in file order: the
last one deletes and recreates the module's node."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import asyncssh
import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2

from localpod import procs
from localpod.gcp import identities
from localpod.pod import LocalPod

pytestmark = pytest.mark.e2e

INSTANCE = re.compile(r"t1v-n-[0-9a-f]{8}-w-(\d+)")
ROOT = Path(__file__).resolve().parents[2]


def instances(tpu: tpu_v2.TpuClient, name: str) -> list[tuple[str, str]]:
    """(hostname, ssh-ed25519 key) per worker, from guest attributes as gcloud reads them."""
    found = []
    for entry in tpu.get_guest_attributes(request={"name": name}).guest_attributes:
        items = {(i.namespace, i.key): i.value for i in entry.query_value.items}
        found.append((items[("", "hostname")], items[("hostkeys", "ssh-ed25519")]))
    return found


def metadata(pod: LocalPod, worker: int, path: str) -> str:
    """What worker `worker` reads from its metadata server (answered by the address asked)."""
    info = pod.describe()
    host, port = info.workers[worker].host, info.pod["metadata_port"]
    url = f"http://{host}:{port}/computeMetadata/v1/{path}"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.read().decode()


async def _ssh(host: str, port: int, known_hosts: str, endpoints: dict) -> str:
    async with asyncssh.connect(
        host,
        port,
        username=endpoints["ssh"]["user"],
        client_keys=[endpoints["ssh"]["key_file"]],
        known_hosts=asyncssh.import_known_hosts(known_hosts),
        agent_path=None,
    ) as conn:
        return (await conn.run("echo ok", check=True)).stdout.strip()


def test_client_parses_list_get_and_guest_attributes(pod, tpu, parent, spec, endpoints) -> None:
    nodes = list(tpu.list_nodes(parent=parent))
    assert [n.name for n in nodes] == [f"{parent}/nodes/local"]
    node = tpu.get_node(name=f"{parent}/nodes/local")
    assert node == nodes[0]
    assert node.state == tpu_v2.Node.State.READY
    assert node.health == tpu_v2.Node.Health.HEALTHY
    assert node.api_version == tpu_v2.Node.ApiVersion.V2
    assert node.id > 0 and node.create_time.year >= 2025
    workers = pod.describe().workers
    assert [(e.ip_address, e.port) for e in node.network_endpoints] == [
        (w.host, 8470) for w in workers
    ]
    # The request's fields come back as sent (Contract 2's spec, what `up` created).
    sent = tpu_v2.Node.from_json(json.dumps(spec["node"]))
    assert node.accelerator_type == sent.accelerator_type == "cpu-4"
    assert dict(node.metadata) == dict(sent.metadata)
    assert dict(node.labels) == {"tpupod-stack": "local", "tpupod-run": pod.run_id}
    assert node.scheduling_config.spot and node.runtime_version == sent.runtime_version

    found = instances(tpu, node.name)
    assert [int(INSTANCE.fullmatch(h).group(1)) for h, _ in found] == [0, 1]
    assert len({h.rsplit("-w-", 1)[0] for h, _ in found}) == 1  # one node, one t1v-n prefix
    assert found[0][1] != found[1][1]  # each worker has its own host key
    one = tpu.get_guest_attributes(
        request={"name": node.name, "worker_ids": ["1"]}
    ).guest_attributes
    assert [i.value for i in one[0].query_value.items][0] == found[1][0]
    # The metadata server names each worker VM as guest attributes do.
    assert [metadata(pod, i, "instance/name") for i in (0, 1)] == [h for h, _ in found]

    # The key in guest attributes is the key each worker's SSH server presents.
    for worker, (_, key) in zip(workers, found, strict=True):
        line = f"[{worker.host}]:{worker.port} ssh-ed25519 {key}\n"
        assert asyncio.run(_ssh(worker.host, worker.port, line, endpoints)) == "ok"
    wrong = f"[{workers[0].host}]:{workers[0].port} ssh-ed25519 {found[1][1]}\n"
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        asyncio.run(_ssh(workers[0].host, workers[0].port, wrong, endpoints))


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")
def test_plain_ssh_checks_strictly_with_known_hosts(pod, tpu, parent, endpoints) -> None:
    ssh = endpoints["ssh"]
    names = [h for h, _ in instances(tpu, f"{parent}/nodes/local")]
    for worker, name in zip(pod.describe().workers, names, strict=True):
        for alias in ([], ["-o", f"HostKeyAlias={name}"]):
            out = subprocess.run(
                ["ssh", "-F", "/dev/null", "-o", f"UserKnownHostsFile={ssh['known_hosts']}",
                 "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", *alias,
                 "-i", ssh["key_file"], "-p", str(worker.port),
                 f"{ssh['user']}@{worker.host}", "echo ok"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr


def test_errors_are_googles(pod, tpu, parent, spec, endpoints) -> None:
    with pytest.raises(exceptions.NotFound):
        tpu.get_node(name=f"{parent}/nodes/other")
    with pytest.raises(exceptions.NotFound):
        tpu.get_operation(request={"name": f"{parent}/operations/operation-1-none"})
    node = tpu_v2.Node.from_json(json.dumps(spec["node"]))
    # HTTP 409 ALREADY_EXISTS: api_core's REST path raises Conflict (AlreadyExists' base class)
    # for any 409, against Google as here; the status is in the body.
    with pytest.raises(exceptions.Conflict) as exists:
        tpu.create_node(parent=parent, node_id="local", node=node)
    assert exists.value.response.json()["error"]["status"] == "ALREADY_EXISTS"
    bad = tpu_v2.Node.from_json(json.dumps({**spec["node"], "acceleratorType": "v4-8"}))
    with pytest.raises(exceptions.BadRequest) as invalid:
        tpu.create_node(parent=parent, node_id="local", node=bad)
    assert "acceleratorType" in invalid.value.message
    assert invalid.value.response.json()["error"]["status"] == "INVALID_ARGUMENT"
    # Unknown fields are refused by name, raw JSON as any REST client sends it.
    url = f"{endpoints['tpu_api']}v2/{parent}/nodes?nodeId=x"
    token = {"Authorization": f"Bearer {identities.operator_token(endpoints)}"}
    request = urllib.request.Request(url, data=b'{"acceleratorTyp": "cpu-4"}', method="POST",
                                     headers=token)  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as unknown:
        urllib.request.urlopen(request, timeout=10)
    assert unknown.value.code == 400 and b"acceleratorTyp" in unknown.value.read()
    assert pod.describe().state == "READY"  # nothing above touched the node


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="no gcloud CLI")
def test_gcloud_lists_and_describes_the_node(pod, endpoints, tmp_path) -> None:
    env = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud")}

    def gcloud(*args: str) -> str:
        out = subprocess.run(
            ["gcloud", *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    gcloud("config", "set", "api_endpoint_overrides/tpu", endpoints["tpu_api"])
    gcloud("config", "set", "auth/access_token_file",
           endpoints["identities"]["operator"]["token_file"])  # fmt: skip
    gcloud("config", "set", "project", endpoints["project"])
    listed = json.loads(
        gcloud("compute", "tpus", "tpu-vm", "list", "--zone", endpoints["zone"], "--format=json")
    )
    assert [(n["name"].rsplit("/", 1)[1], n["state"]) for n in listed] == [("local", "READY")]
    described = json.loads(
        gcloud("compute", "tpus", "tpu-vm", "describe", "local", "--zone", endpoints["zone"],
               "--format=json")
    )  # fmt: skip
    workers = pod.describe().workers
    assert [e["ipAddress"] for e in described["networkEndpoints"]] == [w.host for w in workers]
    assert described["acceleratorType"] == "cpu-4" and described["health"] == "HEALTHY"


def test_endpoints_cli_prints_contract_1_with_live_ports(pod, endpoints) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ops", "local", "endpoints", "--json",
         "--pod-dir", str(pod.paths.root)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert printed == endpoints
    info = pod.describe()
    listening = procs.listening()
    api_port = int(printed["tpu_api"].rstrip("/").rsplit(":", 1)[1])
    storage_port = int(printed["storage"].rsplit(":", 1)[1])
    assert printed["tpu_api"].endswith("/")
    assert {("127.0.0.1", api_port), ("127.0.0.1", storage_port)} <= listening
    assert printed["ssh"]["ports"] == {w.host: w.port for w in info.workers}
    assert {(w.host, w.port) for w in info.workers} <= listening
    assert (printed["project"], printed["zone"], printed["node"]) == (
        "tpupod-local", "local-a", "local",
    )  # fmt: skip
    assert Path(printed["spec_file"]) == pod.paths.node_spec and pod.paths.node_spec.is_file()
    assert "-m localpod.vm.iap {instance} 22 --listen-on-stdin" in printed["ssh"]["iap_command"]


def test_localpod_imports_nothing_from_ops() -> None:
    """The local cloud shares no code with the product it serves (demo/, which drives
    the pod as a user would, is the one part that uses ops)."""
    pattern = re.compile(r"^\s*(from ops[ .]|import ops\b)", re.MULTILINE)
    offenders = [p.name for p in (ROOT / "localpod").glob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


def test_a_watcher_refused_by_the_api_gives_up_in_one_line(pod: LocalPod, tmp_path) -> None:
    """A project the caller has no rights on: the pod's API answers 403 as Google does, and the
    watcher gives up at once (exit 3, not restarted by its unit) with the line naming the fix,
    instead of retrying forever. The same watcher on the right project just watches."""
    from ops.cloud.target import local_target
    from ops.cloud.tpu import TpuProvider
    from ops.watch import EXIT_GAVE_UP, WatchConfig, Watcher
    from ops.watch.journal import Journal

    target = dataclasses.replace(local_target(pod.paths.root), project="someone-elses")
    journal = Journal(tmp_path / "journal.jsonl")
    assert Watcher(TpuProvider(target), journal, WatchConfig(poll=0.05)).run() == EXIT_GAVE_UP
    gave_up = [e for e in journal.events if e["event"] == "gave_up"]
    assert len(gave_up) == 1 and "roles/tpu.admin" in gave_up[0]["message"]
    assert [e["event"] for e in journal.events] == ["watching", "gave_up"]  # no retry
    assert TpuProvider(local_target(pod.paths.root)).describe().state == "READY"  # control


def test_delete_stockout_then_recreate_is_a_new_vm(pod: LocalPod, tpu, parent, spec) -> None:
    name = f"{parent}/nodes/local"
    before = instances(tpu, name)
    known_before = pod.paths.known_hosts.read_text()
    deleted = tpu.delete_node(name=name)
    deleted.result(timeout=60)
    assert list(tpu.list_nodes(parent=parent)) == []
    with pytest.raises(exceptions.NotFound):
        tpu.get_node(name=name)

    node = tpu_v2.Node.from_json(json.dumps(spec["node"]))
    pod.inject_stockout()
    stocked = tpu.create_node(parent=parent, node_id="local", node=node)
    with pytest.raises(exceptions.ResourceExhausted) as exhausted:
        stocked.result(timeout=30)
    assert exhausted.value.grpc_status_code.value[0] == 8
    assert "no more capacity" in exhausted.value.message
    assert list(tpu.list_nodes(parent=parent)) == []  # a stockout leaves no node

    node.metadata["tpupod-test-marker"] = "from the request"
    created = tpu.create_node(parent=parent, node_id="local", node=node)
    ready = created.result(timeout=120)
    # Workers boot from the request's metadata, plus GCE's own per-worker keys.
    for index in (0, 1):
        assert metadata(pod, index, "instance/attributes/tpupod-test-marker") == "from the request"
        assert metadata(pod, index, "instance/attributes/agent-worker-number") == str(index)
    assert isinstance(ready, tpu_v2.Node) and ready.state == tpu_v2.Node.State.READY
    assert ready.name == name and dict(ready.metadata) == dict(node.metadata)
    done = tpu.get_operation(request={"name": created.operation.name})
    assert done.done and done.name == created.operation.name
    meta = tpu_v2.OperationMetadata.deserialize(created.operation.metadata.value)
    assert (meta.verb, meta.target) == ("create", name)

    after = instances(tpu, name)
    assert {h for h, _ in after}.isdisjoint(h for h, _ in before)  # new instance names
    assert {k for _, k in after}.isdisjoint(k for _, k in before)  # new host keys
    known = pod.paths.known_hosts.read_text()
    assert known != known_before and all(k in known for _, k in after)


def test_the_tpu_api_refuses_a_generation_only_compute_engine_makes() -> None:
    """tpu7x-16 (two 4-chip hosts, as this pod's workers) is a real type, but not one the Cloud
    TPU API makes; v6e-16 (four hosts) is, the control."""
    from localpod.gcp.tpu_requests import catalog_hosts

    assert catalog_hosts("tpu7x-16") is None
    assert catalog_hosts("v6e-16") == 4 and catalog_hosts("v5litepod-16") == 4
