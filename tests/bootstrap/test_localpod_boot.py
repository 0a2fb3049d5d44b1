"""bootstrap/startup.sh in the real local pod: worker agents run it from metadata at boot.

Two workers, CPU JAX over gloo, the real trainer. The tests share one pod and run in order:
boot from nothing, re-run, new bundle hash, metadata without the bucket. Re-runs go over SSH
(Fabric), as ops would. The pod cannot change a worker's metadata once created, so the last two
re-run the script against a metadata server of the test's own (the pod's server code, serving
the pod's attributes with some keys changed), as if `pulumi up` had updated them in place.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fabric
import pytest

from contract import metadata
from localpod import procs
from localpod.gcp import storage, tokens
from localpod.gcp.identities import operator_token
from localpod.pod import LocalPod, WorkerInfo
from localpod.vm import memory
from localpod.vm.metadata_server import MetadataServer, MetadataStore
from ops.cloud.target import local_target

pytestmark = pytest.mark.e2e

PHASES = [
    "metadata", "bundle", "uv", "sync", "job-python", "clear-stale", "job-env", "bytecode",
    "start-job",
]  # fmt: skip
# Like the guest agent: fetch the script from metadata into a file, run it with bash.
RERUN = (
    'script="$TPUPOD_ROOT/.bootstrap/rerun.sh" && '
    "curl -sf -H 'Metadata-Flavor: Google' -o \"$script\" "
    '"http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/startup-script" && '
    'bash "$script"'
)


def ssh(worker: WorkerInfo, command: str, env: dict[str, str] | None = None, root: bool = False):
    """As ops reaches a worker: Fabric, key auth only, as the unprivileged login; `root` runs
    the command through the worker's `sudo -n` (with `env`), as the startup script runs as root.
    Returns the fabric Result (no raise)."""
    if root:
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        command = f"sudo -n env {assigns} bash -c {shlex.quote(command)}"
        env = None
    prefix = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
    with fabric.Connection(
        worker.host,
        port=worker.port,
        user=worker.user,
        connect_timeout=15,
        connect_kwargs={
            "key_filename": worker.key_filename,
            "look_for_keys": False,
            "allow_agent": False,
        },
    ) as conn:
        return conn.run(prefix + command, hide=True, in_stream=False, timeout=300, warn=True)


def read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def phase_lines(text: str, phase: str) -> list[str]:
    return [line for line in text.splitlines() if f" [{phase}] " in line]


def wait_first_step(roots: list[Path], timeout: float = 240.0) -> dict[int, float]:
    """Until each worker's trainer reports a training step; when each was first seen."""
    seen: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(roots):
        for i, root in enumerate(roots):
            status = read(root / "status.json")
            if i not in seen and status and status["state"] == "training" and status["step"] >= 1:
                seen[i] = time.time()
            boot = read(root / "bootstrap.json")
            assert not boot or boot["state"] != "failed", boot
        if time.monotonic() > deadline:
            logs = [(r / "job.log").read_text()[-2000:] for r in roots if (r / "job.log").exists()]
            raise AssertionError(f"no first step after {timeout:.0f}s: {seen}\n{logs}")
        time.sleep(0.1)
    return seen


def trainer_processes(root: Path) -> list[int]:
    """Live `python -m trainer` processes running from one of this worker's bundles."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except (OSError, ValueError):
            continue
        if cmdline[1:3] == [b"-m", b"trainer"] and cwd.startswith(str(root / "bundles")):
            found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def local_pod(tmp_path_factory):
    pod = LocalPod(
        tmp_path_factory.mktemp("localpod") / "pod",
        workers=2,
        # Long enough to outlive the module; only preemption saves, which keeps stops quick
        # on a loaded machine (the emulator is slow, and a stop waits for a save in flight).
        trainer_args="--config tiny --steps 100000 --set checkpoint_every=0",
    )
    try:
        pod.up()
        yield pod
    finally:
        pod.down()
    assert not memory.pod_memory(pod.paths.root).exists()  # the workers' /dev/shm went with it


def shm_usable() -> bool:
    """What startup.sh's env_home asks of the workers' memory, here of the host's /dev/shm."""
    options = next((line.split()[3] for line in Path("/proc/mounts").read_text().splitlines()
                    if line.split()[1] == "/dev/shm"), "noexec")  # fmt: skip
    return "noexec" not in options.split(",") and shutil.disk_usage("/dev/shm").free >= 4096 << 20


@contextlib.contextmanager
def changed_metadata(pod: LocalPod, **changes: str | None):
    """A metadata server on the workers' addresses serving the pod's attributes with `changes`
    (None drops a key); yields GCE_METADATA_HOST for each worker."""
    info = pod.describe()
    addresses = [w.host for w in info.workers]
    attributes = {}
    for i, address in enumerate(addresses):
        request = urllib.request.Request(
            f"http://{address}:{info.pod['metadata_port']}/computeMetadata/v1/"
            "instance/attributes/?recursive=true",
            headers={"Metadata-Flavor": "Google"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            attrs = json.loads(resp.read())
        for key, value in changes.items():
            if value is None:
                attrs.pop(key, None)
            else:
                attrs[key] = value
        attributes[i] = attrs
    store = MetadataStore(token_key=tokens.read_key(pod.paths.root))  # the pod's tokens
    store.set_attributes(attributes, {i: f"tpupod-local-w-{i}" for i in attributes})
    store.set_node(service_account=pod.endpoints()["identities"]["worker-0"]["email"])
    port = procs.free_port_on_all(addresses)
    server = MetadataServer(addresses, port, store)
    server.start()
    try:
        yield [f"{address}:{port}" for address in addresses]
    finally:
        server.stop()


def roots_of(pod: LocalPod) -> list[Path]:
    return [pod.paths.tpupod_root(i) for i in range(pod.workers)]


def bytecode_marker(root: Path) -> dict:
    return json.loads((root / "current" / ".venv" / ".tpupod-bytecode").read_text())


def wait_for_object(pod: LocalPod, uri: str, timeout: float = 120.0) -> None:
    info = pod.describe()
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    url = f"{info.pod['emulator_url']}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
    request = urllib.request.Request(url, headers=storage.auth(operator_token(pod.endpoints())))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10):
                return
        except urllib.error.HTTPError as e:
            assert e.code == 404 and time.monotonic() < deadline, f"no {uri} after {timeout}s"
        time.sleep(0.5)


def test_local_pod_boots_both_workers_to_training(local_pod):
    roots = roots_of(local_pod)
    first_step = wait_first_step(roots)
    for i, root in enumerate(roots):
        boot = read(root / "bootstrap.json")
        assert boot["state"] == "ok", boot
        assert [p["name"] for p in boot["phases"]] == PHASES
        assert all(p["state"] == "ok" for p in boot["phases"])
        status = read(root / "status.json")
        assert status["process_id"] == i and status["step"] >= 1
        env = dict(line.split("=", 1) for line in (root / "job.env").read_text().splitlines())
        assert env["TPUPOD_NUM_PROCESSES"] == "2" and env["TPUPOD_PROCESS_ID"] == str(i)
        assert env["JAX_COORDINATOR_ADDRESS"].startswith(local_pod.describe().workers[0].host + ":")
        assert env["TPUPOD_RUN_ID"] == local_pod.run_id
        assert len(trainer_processes(root)) == 1
        # The environment lives in the worker's memory (a tmpfs), the bundle links to it; on a
        # host whose /dev/shm is small or noexec (a container's), on the disk.
        home = memory.worker_memory(local_pod.paths.root, i) if shm_usable() else root
        assert (root / "current" / ".venv").resolve().is_relative_to(home)
        assert f"environments in {home}" in (root / "bootstrap.log").read_text()
        # A new bucket holds no bytecode yet: the first job publishes it.
        assert bytecode_marker(root)["found"] is False
        phases = " ".join(f"{p['name']}={p['seconds']:.1f}s" for p in boot["phases"])
        print(f"worker {i}: boot -> first step {first_step[i] - boot['started']:.1f}s ({phases})")


def test_local_pod_rerun_over_ssh_changes_nothing(local_pod):
    roots = roots_of(local_pod)
    workers = local_pod.describe().workers
    wait_first_step(roots)
    pids = [(root / "job.pid").read_text().strip() for root in roots]
    bundles = [sorted(p.name for p in (root / "bundles").iterdir()) for root in roots]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(ssh, workers, [RERUN] * 2, [None] * 2, [True] * 2))
    for result, root in zip(results, roots, strict=True):
        assert result.ok, result.stdout + result.stderr
        sync = phase_lines(result.stdout, "sync")
        assert sync and not any("Installed" in line for line in sync), result.stdout
        assert any("already present" in line for line in phase_lines(result.stdout, "bundle"))
        start = phase_lines(result.stdout, "start-job")
        assert any("job already running" in line for line in start), result.stdout
        assert read(root / "bootstrap.json")["state"] == "ok"
    assert [(root / "job.pid").read_text().strip() for root in roots] == pids
    assert [sorted(p.name for p in (root / "bundles").iterdir()) for root in roots] == bundles
    # One trainer per worker, the same one, still beating.
    rerun_done = time.time()
    for worker, root in zip(workers, roots, strict=True):
        assert len(trainer_processes(root)) == 1
        status = ssh(worker, '"$TPUPOD_ROOT/current/bootstrap/jobctl.sh" status')
        assert status.stdout.strip() == f"running pid {pids[worker.index]}"
        deadline = time.monotonic() + 30
        while read(root / "status.json")["heartbeat"] <= rerun_done:
            assert time.monotonic() < deadline, "the trainer stopped beating after the re-run"
            time.sleep(0.2)


def test_local_pod_new_bundle_hash_fetches_and_restarts(local_pod, bundles):
    roots = roots_of(local_pod)
    info = local_pod.describe()
    new = bundles[1]
    old = [os.readlink(root / "current").split("/")[-1] for root in roots]
    assert new.sha256 not in old
    old_pids = [int((root / "job.pid").read_text()) for root in roots]
    # Worker 0's trainer publishes its imports' bytecode; the new bundle's venv restores it.
    wait_for_object(local_pod, bytecode_marker(roots[0])["uri"])
    storage.upload_bundle(info.pod["emulator_url"], info.pod["bucket"], new,
                          operator_token(local_pod.endpoints()))  # fmt: skip
    changes = {"tpupod-bundle-sha256": new.sha256, "tpupod-bundle-object": new.object_name}
    with changed_metadata(local_pod, **changes) as hosts:
        # Both workers at once: a multi-host job stops as a whole.
        env = [{"GCE_METADATA_HOST": h, "TPUPOD_STOP_TIMEOUT": "30"} for h in hosts]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(ssh, info.workers, [RERUN] * 2, env, [True] * 2))
    for i, (result, root) in enumerate(zip(results, roots, strict=True)):
        assert result.ok, result.stdout + result.stderr
        assert os.readlink(root / "current") == f"bundles/{new.sha256}"
        assert (root / "bundles" / new.sha256 / ".tpupod-bundle").read_text().strip() == new.sha256
        assert read(root / "bootstrap.json")["bundle_sha256"] == new.sha256
        stale = phase_lines(result.stdout, "clear-stale")
        assert any(f"runs bundle {old[i]}, want {new.sha256}" in line for line in stale)
        # Exit 75 once its preemption save commits; SIGKILL (137) after the stop timeout if not.
        assert any("job stopped (exit code" in line for line in stale), result.stdout
        assert not procs.alive(old_pids[i])
        assert int((root / "job.pid").read_text()) != old_pids[i]
        marker = bytecode_marker(root)
        assert marker["found"] is True and marker["restored"] > 100, marker
        restored = phase_lines(result.stdout, "bytecode")
        assert any(f"restored {marker['restored']} modules" in line for line in restored)
    wait_first_step(roots)
    for root in roots:
        (pid,) = trainer_processes(root)
        assert os.readlink(f"/proc/{pid}/cwd").endswith(f"{new.sha256}/job")


def test_local_pod_metadata_without_bucket_names_the_phase(local_pod):
    worker, root = local_pod.describe().workers[0], roots_of(local_pod)[0]
    pid = (root / "job.pid").read_text()
    with changed_metadata(local_pod, **{"tpupod-bucket": None}) as hosts:
        result = ssh(worker, RERUN, {"GCE_METADATA_HOST": hosts[0]}, root=True)
    assert not result.ok
    boot = read(root / "bootstrap.json")
    assert boot["state"] == "failed" and boot["phase"] == "metadata"
    assert boot["message"] == "metadata key tpupod-bucket is missing"
    expected = "[metadata] FAILED: metadata key tpupod-bucket is missing"
    assert expected in result.stdout
    assert expected in (root / "bootstrap.log").read_text()
    # It failed before touching anything: the trainer runs on.
    assert (root / "job.pid").read_text() == pid and trainer_processes(root)


def test_a_rollout_patches_the_node_and_reaches_every_worker(local_pod) -> None:
    """`tpupod local rollout` does what `pulumi up` does (a bundle uploaded, nodes.patch of the
    node's metadata, which the workers' metadata servers serve at once); `tpupod rollout` puts
    it on every worker (the job saves and stops, the startup script runs again) without a
    recreate. nodes.patch refuses a field the API does not update."""
    from google.api_core import exceptions
    from google.cloud import tpu_v2
    from google.protobuf import field_mask_pb2

    from localpod.gcp import tpu_client

    pod = local_pod
    root, where = str(pod.paths.root), ["--pod-dir", str(pod.paths.root)]
    tpupod = [sys.executable, "-m", "ops"]
    api = tpu_client.client(pod.endpoints())
    name = local_target(pod.paths.root).node_name
    node = api.get_node(name=name)
    old, created = node.metadata[metadata.BUNDLE_SHA256], node.create_time
    with pytest.raises(exceptions.BadRequest, match="update_mask"):
        api.update_node(node=tpu_v2.Node(name=name, accelerator_type="v4-8"),
                        update_mask=field_mask_pb2.FieldMask(paths=["accelerator_type"]))  # fmt: skip
    publish = subprocess.run([*tpupod, "local", "rollout", "--preset", "tiny", "--steps", "999",
                              *where], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert publish.returncode == 0, publish.stderr
    node = api.get_node(name=name)
    new = node.metadata[metadata.BUNDLE_SHA256]
    assert new != old and new[:12] in publish.stdout and node.create_time == created
    served = urllib.request.Request(
        f"http://{pod.describe().workers[1].host}:{pod.describe().pod['metadata_port']}"
        f"/computeMetadata/v1/instance/attributes/{metadata.BUNDLE_SHA256}",
        headers={"Metadata-Flavor": "Google"},
    )
    assert urllib.request.urlopen(served, timeout=10).read().decode() == new
    pids = [int((Path(root) / "workers" / str(i) / "tpupod" / "job.pid").read_text())
            for i in range(2)]  # fmt: skip
    rolled = subprocess.run([*tpupod, "rollout", "--stack", "local", *where], capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    said = " ".join(rolled.stdout.split())  # was: what the workers ran (the tests above)
    assert f"bundle {new[:12]} rolled out (was " in said, said
    for i in range(2):
        boot = json.loads(
            (Path(root) / "workers" / str(i) / "tpupod" / "bootstrap.json").read_text()
        )
        assert boot["bundle_sha256"] == new and boot["state"] == "ok", boot
        pid = int((Path(root) / "workers" / str(i) / "tpupod" / "job.pid").read_text())
        assert pid != pids[i] and procs.alive(pid)
    assert api.get_node(name=name).create_time == created  # the same node: no recreate
    same = subprocess.run([*tpupod, "rollout", "--stack", "local", *where], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert same.returncode == 0 and "nothing to roll out" in same.stdout, same.stderr
    # Without flags `tpupod local rollout` rebuilds the job running (the built-in trainer's, from
    # its spec): the same bundle, so nothing changes (another job would name another bundle).
    again = subprocess.run([*tpupod, "local", "rollout", *where], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert again.returncode == 0 and f"bundle {new[:12]} is the node's already" in again.stdout
