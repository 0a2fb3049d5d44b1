"""bootstrap/startup.sh in the real local pod: worker agents run it from metadata at boot.

Two workers, CPU JAX over gloo, the real trainer; the re-run goes over SSH (Fabric) as ops would.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import fabric
import pytest

from localpod.pod import LocalPod, WorkerInfo

pytestmark = pytest.mark.e2e

PHASES = ["metadata", "uv", "bundle", "sync", "clear-stale", "trainer-env", "start-trainer"]
# Like the guest agent: fetch the script from metadata into a file, run it with bash.
RERUN = (
    'script="$TPUPOD_ROOT/.bootstrap/rerun.sh" && '
    "curl -sf -H 'Metadata-Flavor: Google' -o \"$script\" "
    '"http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/startup-script" && '
    'bash "$script"'
)


def ssh(worker: WorkerInfo, command: str) -> str:
    """As ops reaches a worker: Fabric, key auth only."""
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
        return conn.run(command, hide=True, in_stream=False, timeout=300).stdout


def read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


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
            logs = [
                (r / "trainer.log").read_text()[-2000:]
                for r in roots
                if (r / "trainer.log").exists()
            ]
            raise AssertionError(f"no first step after {timeout:.0f}s: {seen}\n{logs}")
        time.sleep(0.1)
    return seen


@pytest.fixture(scope="module")
def local_pod(tmp_path_factory):
    pod = LocalPod(
        tmp_path_factory.mktemp("localpod") / "pod",
        workers=2,
        trainer_args="--config tiny --steps 100000",
    )
    try:
        pod.up()
        yield pod
    finally:
        pod.down()


def roots_of(pod: LocalPod) -> list[Path]:
    return [pod.paths.home(i) / "tpupod" for i in range(pod.workers)]


def test_local_pod_boots_both_workers_to_training(local_pod):
    roots = roots_of(local_pod)
    first_step = wait_first_step(roots)
    for i, root in enumerate(roots):
        boot = read(root / "bootstrap.json")
        assert boot["state"] == "ok", boot
        assert [p["name"] for p in boot["phases"]] == PHASES
        status = read(root / "status.json")
        assert status["process_id"] == i and status["state"] == "training"
        phases = " ".join(f"{p['name']}={p['seconds']:.1f}s" for p in boot["phases"])
        print(f"worker {i}: boot -> first step {first_step[i] - boot['started']:.1f}s ({phases})")


def test_local_pod_rerun_over_ssh_changes_nothing(local_pod):
    roots = roots_of(local_pod)
    wait_first_step(roots)
    pids = [(root / "trainer.pid").read_text().strip() for root in roots]
    for worker, root in zip(local_pod.describe().workers, roots, strict=True):
        out = ssh(worker, RERUN)
        sync = [line for line in out.splitlines() if " [sync] " in line]
        assert sync and not any("Installed" in line for line in sync), out
        assert "already present" in out and "trainer already running" in out, out
        assert read(root / "bootstrap.json")["state"] == "ok"
    assert [(root / "trainer.pid").read_text().strip() for root in roots] == pids
    # One trainer per worker, and it goes on training.
    for worker, root in zip(local_pod.describe().workers, roots, strict=True):
        assert ssh(worker, '"$TPUPOD_ROOT/current/bootstrap/trainerctl.sh" status').startswith(
            "running pid"
        )
        step = read(root / "status.json")["step"]
        deadline = time.monotonic() + 60
        while read(root / "status.json")["step"] <= step:
            assert time.monotonic() < deadline, "trainer stopped training after the re-run"
            time.sleep(0.2)
