"""Shared e2e fixtures: an emulator-backed 2-worker local pod in a tmp dir, always torn down.

The pod boots a small stand-in startup script (not bootstrap/startup.sh) that reads its metadata,
detaches a fake trainer with setsid + pidfile, the way jobctl.sh does on the local pod, and
reports its bootstrap ok.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import fabric
import paramiko
import pytest

from localpod.pod import LocalPod, WorkerInfo

STARTUP_SCRIPT = r"""#!/bin/bash
set -euo pipefail
md() { curl -sf -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/$1"; }
mkdir -p "$TPUPOD_ROOT"
number=$(md instance/attributes/agent-worker-number)
setsid bash -c 'echo $$ > "$TPUPOD_ROOT/job.pid"; exec sleep 3600' </dev/null >/dev/null 2>&1 &
while [ ! -s "$TPUPOD_ROOT/job.pid" ]; do sleep 0.05; done
echo "$number" > "$TPUPOD_ROOT/booted"
echo '{"state": "ok", "phase": "start-job"}' > "$TPUPOD_ROOT/bootstrap.json"
"""


@pytest.fixture(scope="session")
def startup_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("script") / "startup.sh"
    path.write_text(STARTUP_SCRIPT)
    return path


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory, startup_script: Path) -> Iterator[LocalPod]:
    """A READY 2-worker pod for the module; down() runs whatever happens in the tests."""
    local_pod = LocalPod(tmp_path_factory.mktemp("pod"), workers=2, startup_script=startup_script)
    try:
        local_pod.up()
        yield local_pod
    finally:
        local_pod.down()


@pytest.fixture
def pod_factory(tmp_path: Path, startup_script: Path) -> Iterator[Callable[..., LocalPod]]:
    """make(workers=2, **LocalPod options) -> a LocalPod (not yet up) in this test's tmp dir; all downed at teardown."""
    made: list[LocalPod] = []

    def make(workers: int = 2, **options) -> LocalPod:
        local_pod = LocalPod(
            tmp_path / f"pod{len(made)}", workers=workers, startup_script=startup_script, **options
        )
        made.append(local_pod)
        return local_pod

    try:
        yield make
    finally:
        for local_pod in made:
            local_pod.down()


@pytest.fixture(scope="session")
def ssh_run() -> Callable[[WorkerInfo, str], str]:
    return run


@pytest.fixture(scope="session", name="connect")
def connect_fixture() -> Callable[[WorkerInfo], fabric.Connection]:
    return connect


@pytest.fixture(scope="session")
def booted() -> Callable[[LocalPod], None]:
    return wait_booted


def connect(worker: WorkerInfo) -> fabric.Connection:
    """As ops reaches a TPU worker: Fabric, key auth, no agent, no default keys, and only the
    host key the pod published (its known_hosts, beside keys/) accepted."""
    conn = fabric.Connection(
        worker.host,
        port=worker.port,
        user=worker.user,
        connect_timeout=15,
        connect_kwargs={
            "key_filename": worker.key_filename,
            "look_for_keys": False,
            "allow_agent": False,
        },
    )
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    conn.client.load_host_keys(str(Path(worker.key_filename).parents[1] / "known_hosts"))
    return conn


def run(worker: WorkerInfo, command: str) -> str:
    with connect(worker) as conn:
        return conn.run(command, hide=True, in_stream=False).stdout


def wait_booted(pod: LocalPod, timeout: float = 60.0) -> None:
    """Until every worker's startup script has started its fake trainer."""
    deadline = time.monotonic() + timeout
    for worker in pod.describe().workers:
        while "yes" not in run(worker, 'test -s "$TPUPOD_ROOT/booted" && echo yes || true'):
            assert time.monotonic() < deadline, f"worker {worker.index} did not boot"
            time.sleep(0.2)
