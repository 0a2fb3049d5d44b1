"""The built-in trainer's standby on a 2-worker local pod (docs/proposals/standby-interpreter.md):
after the job's first progress each worker parks its next attempt; a crash's restart as `watch`
makes it (ops' WorkerGroup: stop that keeps the standby, clear-locks, start) promotes it on
every worker: the launcher that parked is the job's, the trainer runs in the parked
interpreter, resumes and trains. Control: a stop without keep (a rollout, `tpupod stop`)
discards it, and the next start is cold. Bitwise equality after a promoted restart is
test_demo.py's (its hang and crash restarts promote the standby)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from demo.reference import pod_provider
from localpod.pod import LocalPod
from ops.fleet.starts import starts
from ops.fleet.workers import STOP_AND_CLEAR, WorkerGroup

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]


def wait_until(what: str, predicate, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def parked(root: Path) -> dict | None:
    """standby.json once its imports are done (it names the standby from its start)."""
    try:
        said = json.loads((root / "standby.json").read_text())
    except (OSError, ValueError):
        return None
    return said if said.get("parked") else None


def training_past(root: Path, step: int) -> bool:
    try:
        status = json.loads((root / "status.json").read_text())
    except (OSError, ValueError):
        return False
    return status.get("state") == "training" and status.get("step", 0) > step


def test_a_crash_restart_promotes_the_parked_attempt_and_a_plain_stop_discards_it(tmp_path):
    pod = LocalPod(tmp_path / "pod", workers=2, trainer_args="--config tiny --steps 100000")
    try:
        pod.up()
        roots = [pod.paths.tpupod_root(i) for i in range(2)]
        wait_until("a standby on every worker", lambda: all(parked(r) for r in roots))
        standbys = [parked(r) for r in roots]
        pod.crash(0)
        workers = pod_provider(pod.paths.root).describe().workers
        with WorkerGroup(workers, retries=1) as group:
            how = starts(group.restart(attempt=2, stop_timeout=1))  # as watch restarts a crash
            assert how.text() == ", 2 of 2 from their standby", how  # watch journals it
            for root, standby in zip(roots, standbys, strict=True):
                assert int((root / "job.pid").read_text()) == standby["pid"]
                log = (root / "logs" / "job-attempt-2.log").read_text()
                assert f"promoted the standby (pid {standby['child']})" in log, log[-2000:]
            wait_until("training again", lambda: all(training_past(r, 0) for r in roots))
            # the trainer runs in the parked interpreter (process 0 logs its events)
            lines = (roots[0] / "logs" / "job-attempt-2.log").read_text().splitlines()
            started = [json.loads(line) for line in lines if '"event": "started"' in line]
            assert started and started[0]["pid"] == standbys[0]["child"], lines[:8]
            wait_until("the next standby", lambda: all(parked(r) for r in roots))
            group.jobctl(STOP_AND_CLEAR, stop_timeout=1)  # control: no keep (a rollout's stop)
            assert not any(parked(r) for r in roots)
            assert starts(group.jobctl("start", attempt=3)).text() == ""  # none to use
            wait_until("training cold", lambda: all(training_past(r, 0) for r in roots))
            for root in roots:
                log = (root / "logs" / "job-attempt-3.log").read_text()
                assert "promoted the standby" not in log, log[-2000:]
    finally:
        pod.down()
