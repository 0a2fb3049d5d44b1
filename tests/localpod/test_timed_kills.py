"""A kill timed to a job's state (localpod.timed_kills): it waits for another process than the
one running when it was armed, fires only once that process says the state, and keeps what
it found. Real processes write the status file through the trainer's own StatusFile."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from localpod.timed_kills import TimedKills

_WRITER = """
import sys, time
from trainer.status import StatusFile
f = StatusFile(sys.argv[1])
for state in sys.argv[2:]:
    f.update(state=state)
    time.sleep(2.0)  # a state outlasts the kill's delay (0.1 s) on a loaded machine too
time.sleep(60)
"""


def _job(status: Path, *states: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WRITER, str(status), *states],
                            start_new_session=True)  # fmt: skip


def _wait(kills: TimedKills, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        (record,) = kills.report()
        if record["fired"] or record["error"]:
            return record
        time.sleep(0.05)
    raise AssertionError(f"the kill neither fired nor failed: {kills.report()}")


def test_the_kill_waits_for_a_new_process_in_the_state_and_lands_in_it(tmp_path: Path):
    status = tmp_path / "status.json"
    jobs: list[subprocess.Popen] = []

    def signal_job(worker: int, sig: int) -> int:
        os.killpg(jobs[-1].pid, sig)
        return jobs[-1].pid

    try:
        old = _job(status, "restoring")  # the process running when the kill is armed
        jobs.append(old)
        while not status.exists():
            time.sleep(0.02)
        time.sleep(0.2)
        kills = TimedKills(lambda i: status, signal_job)
        kills.arm(0, "restoring", delay=0.1, timeout=30)
        time.sleep(0.5)
        assert kills.report()[0]["fired"] is None  # its own `restoring` does not count
        new = _job(status, "initializing", "restoring", "compiling")
        jobs.append(new)
        record = _wait(kills)
        assert record["error"] is None and record["state_at_kill"] == "restoring", record
        assert record["pid"] == new.pid and new.wait(timeout=10) == -signal.SIGKILL
        assert old.poll() is None  # only the new process was killed
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()


def test_a_state_that_never_comes_is_reported_and_nothing_is_killed(tmp_path: Path):
    status = tmp_path / "status.json"
    killed: list[int] = []
    job = _job(status, "initializing", "compiling", "training")
    try:
        kills = TimedKills(lambda i: status, lambda worker, sig: killed.append(worker) or 0)
        kills.arm(0, "restoring", delay=0.0, timeout=2.5)
        record = _wait(kills)
        assert record["fired"] is None and "no status 'restoring' within 2.5s" in record["error"]
        assert killed == [] and job.poll() is None
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
