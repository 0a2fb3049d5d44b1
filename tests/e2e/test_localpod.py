"""The local pod end to end: real SSH (Fabric), real metadata HTTP, real emulator, real signals."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

from contract import metadata
from demo.reference import pod_provider
from localpod import procs
from localpod.gcp import storage, tokens
from localpod.gcp.identities import operator_token
from localpod.pod import LocalPod
from ops.cloud.slice import SliceState

pytestmark = pytest.mark.e2e

MD = 'curl -sf -H "Metadata-Flavor: Google" "http://$GCE_METADATA_HOST/computeMetadata/v1/{}"'


def _worker_tree(pod: LocalPod) -> list[procs.Proc]:
    """Every process of every worker: agents and all their descendants."""
    found = []
    for worker in pod.describe().workers:
        if worker.agent_pid and (agent := procs.read_proc(worker.agent_pid)):
            found += [agent, *procs.descendants(agent.pid)]
    return found


def test_fabric_runs_a_command_on_each_worker(pod: LocalPod, ssh_run, connect) -> None:
    info = pod.describe()
    assert info.state == SliceState.READY and info.health == "HEALTHY"
    assert [w.host for w in info.workers] == [f"127.0.{info.pod['subnet']}.{i}" for i in (1, 2)]
    for worker in info.workers:
        out = ssh_run(worker, 'echo "$USER|$HOME|$TPUPOD_ROOT|$JAX_PLATFORMS|$TPUPOD_LOCAL_POD"')
        worker_dir = Path(info.pod["pod_dir"]) / "workers" / str(worker.index)
        home, root = worker_dir / "home", worker_dir / "tpupod"  # TPUPOD_ROOT is root's
        assert out.strip() == f"{worker.user}|{home}|{root}|cpu|1"
    # Exit codes, stderr, a pty and SFTP behave as on a real sshd.
    with connect(info.workers[1]) as conn:
        failed = conn.run("echo oops >&2; exit 7", hide=True, warn=True, in_stream=False)
        assert (failed.exited, failed.stderr) == (7, "oops\n")
        assert conn.run("echo tty", pty=True, hide=True, in_stream=False).stdout.strip() == "tty"
        conn.put(io.StringIO("via sftp\n"), "sftp.txt")
        assert conn.run("cat ~/sftp.txt", hide=True, in_stream=False).stdout == "via sftp\n"


def test_metadata_answers_each_worker_as_itself(pod: LocalPod, ssh_run) -> None:
    info = pod.describe()
    endpoints = metadata.network_endpoints_value([w.host for w in info.workers])
    for worker in info.workers:
        attributes = json.loads(ssh_run(worker, MD.format("instance/attributes/?recursive=true")))
        assert attributes[metadata.AGENT_WORKER_NUMBER] == str(worker.index)
        assert attributes[metadata.WORKER_NETWORK_ENDPOINTS] == endpoints
        assert attributes[metadata.UV_GROUP] == ""
        assert attributes[metadata.STARTUP_SCRIPT].startswith("#!/bin/bash")
        assert ssh_run(worker, MD.format("instance/preempted")) == "FALSE"
        token = json.loads(ssh_run(worker, MD.format("instance/service-accounts/default/token")))
        email = pod.endpoints()["identities"][f"worker-{worker.index}"]["email"]
        key = tokens.read_key(pod.paths.root)
        assert tokens.verify(key, token["access_token"]) == (email, "")  # its account's
        # The startup script ran from metadata and saw its own number too.
        assert ssh_run(worker, 'cat "$TPUPOD_ROOT/booted"').strip() == str(worker.index)

    url = f"http://{info.workers[1].host}:{info.pod['metadata_port']}/computeMetadata/v1/"
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(url + "instance/hostname", timeout=5)
    assert denied.value.code == 403
    request = urllib.request.Request(
        url + "instance/hostname", headers={"Metadata-Flavor": "Google"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        endpoints = pod.endpoints()
        zone, project = endpoints["zone"], endpoints["project"]
        expected = f"{info.workers[1].hostname}.{zone}.c.{project}.internal"
        assert resp.read().decode() == expected


def test_bucket_object_written_by_one_worker_is_read_by_the_other(pod: LocalPod, ssh_run) -> None:
    """Under the stack's grants (the run's prefix is the workers'), through each VM's own storage
    URL and no token, as emulator-mode clients call it; outside those grants, 403."""
    info = pod.describe()
    bucket = info.pod["bucket"]
    name = f"{pod.run_prefix}/e2e/msg"

    def upload(object_name: str) -> str:
        return (
            f'echo "hello from $(hostname) $$" > /tmp/tpupod-e2e-$$ && curl -s -X POST '
            f'--data-binary @/tmp/tpupod-e2e-$$ -H "Content-Type: text/plain" -o /dev/null '
            f'-w "%{{http_code}} " "$STORAGE_EMULATOR_HOST/upload/storage/v1/b/{bucket}/o?'
            f'uploadType=media&name={object_name}" && cat /tmp/tpupod-e2e-$$ && rm /tmp/tpupod-e2e-$$'
        )

    code, written = ssh_run(info.workers[0], upload(name)).split(" ", 1)
    assert code == "200"
    read = ssh_run(
        info.workers[1],
        f'curl -sf "$STORAGE_EMULATOR_HOST/storage/v1/b/{bucket}/o/{quote(name, safe="")}?alt=media"',
    )
    assert read == written and written.startswith("hello from")
    # The code bundles are read-only to the workers, and nothing else of the bucket is theirs.
    for elsewhere in ("bundles/forged.tar.gz", "e2e/msg"):
        code, _ = ssh_run(info.workers[0], upload(elsewhere)).split(" ", 1)
        assert code == "403", elsewhere
    # The code bundle is there, under the name and hash the metadata announces.
    attributes = json.loads(
        ssh_run(info.workers[1], MD.format("instance/attributes/?recursive=true"))
    )
    data = storage.download(info.pod["emulator_url"], bucket, attributes[metadata.BUNDLE_OBJECT],
                            operator_token(pod.endpoints()))  # fmt: skip
    assert hashlib.sha256(data).hexdigest() == attributes[metadata.BUNDLE_SHA256]


def test_crash_and_hang_signal_the_trainer(pod: LocalPod, booted) -> None:
    booted(pod)
    hung = pod.hang(1)
    deadline = time.monotonic() + 10  # signal delivery is asynchronous
    while procs.read_proc(hung).state != "T":
        assert time.monotonic() < deadline, "trainer not stopped"
        time.sleep(0.05)
    crashed = pod.crash(0)
    assert procs.wait_gone(crashed, None, timeout=10)
    assert pod.describe().state == SliceState.READY  # the VM is fine; only the trainer died


def test_preempt_leaves_no_worker_process_then_recreate(pod: LocalPod, booted, ssh_run) -> None:
    booted(pod)
    ssh_run(pod.describe().workers[0], "touch ~/old-disk")
    before = _worker_tree(pod)
    # Two agents and worker 1's stopped (SIGSTOP) trainer at least; worker 0's was crashed above.
    assert len(before) >= 3
    info = pod.preempt(notice=2)
    assert info.state == SliceState.PREEMPTED
    assert info.preempted
    assert [p.pid for p in before if procs.alive(p.pid, p.start)] == []

    provider = pod_provider(pod.paths.root)
    provider.recreate()
    info = pod.wait_for({SliceState.READY}, timeout=60)
    assert not info.preempted and all(w.alive for w in info.workers)
    assert provider.describe().state == SliceState.READY
    booted(pod)  # booted again, on a wiped disk
    assert ssh_run(info.workers[0], "ls ~/old-disk 2>/dev/null || echo wiped").strip() == "wiped"


def test_cli_status_and_errors(pod: LocalPod, tmp_path: Path) -> None:
    tpupod = [sys.executable, "-m", "ops"]
    status = subprocess.run(
        [*tpupod, "status", "--stack", "local", "--pod-dir", str(pod.paths.root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert "READY" in status.stdout and pod.describe().workers[1].host in status.stdout
    absent = subprocess.run(
        [*tpupod, "local", "crash", "--worker", "0", "--pod-dir", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert absent.returncode == 2
    assert absent.stderr.startswith("tpupod: no local pod is up")
    assert len(absent.stderr.strip().splitlines()) == 1
    # A kill armed for a state (the campaign's restore-kill): nothing is killed now.
    armed = subprocess.run(
        [*tpupod, "local", "crash", "--worker", "1", "--when", "restoring", "--delay", "0.5",
         "--pod-dir", str(pod.paths.root)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert armed.returncode == 0, armed.stderr
    assert "armed: its next job is killed 0.5 s after saying 'restoring'" in armed.stdout
    (kill,) = pod.timed_kills()
    assert kill["worker"] == 1 and kill["state"] == "restoring" and kill["fired"] is None, kill


def test_a_second_up_is_refused_in_one_line(pod: LocalPod, tmp_path: Path) -> None:
    """While one `up` starts a pod (it holds the directory's lock) and once the pod is up."""
    tpupod = [sys.executable, "-m", "ops", "local", "up"]
    again = subprocess.run([*tpupod, "--pod-dir", str(pod.paths.root)], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stderr
    assert f"a local pod is already up in {pod.paths.root} (controller pid" in again.stderr
    assert f"run {pod.run_id}" in again.stderr
    starting = tmp_path / "starting"
    starting.mkdir()
    with open(starting / "up.lock", "w") as lock:  # as an `up` under way holds it
        fcntl.flock(lock, fcntl.LOCK_EX)
        racing = subprocess.run([*tpupod, "--pod-dir", str(starting)], capture_output=True,
                                text=True, timeout=60)  # fmt: skip
    assert racing.returncode == 2 and len(racing.stderr.strip().splitlines()) == 1
    assert "another `tpupod local up` is starting the pod in" in racing.stderr
    assert not (starting / "pod.json").exists()  # nothing started


def test_down_leaves_no_process_and_no_port(pod_factory, booted) -> None:
    pod = pod_factory(workers=2)
    ours: list[procs.Proc] = []
    ports: set[tuple[str, int]] = set()
    try:
        info = pod.up()
        booted(pod)
        layout = info.pod
        ours = [procs.read_proc(layout["controller_pid"]), procs.read_proc(layout["emulator_pid"])]
        ours += procs.descendants(layout["controller_pid"])
        assert len(ours) >= 6  # controller, emulator, 2 agents, 2 trainers
        ports = {("127.0.0.1", layout["control_port"]), ("127.0.0.1", layout["emulator_port"])}
        for worker in info.workers:
            ports |= {(worker.host, worker.port), (worker.host, layout["metadata_port"])}
        assert ports <= procs.listening()
    finally:
        pod.down()
    assert [p.pid for p in ours if procs.alive(p.pid, p.start)] == []
    assert ports & procs.listening() == set()
    assert not pod.is_up()
