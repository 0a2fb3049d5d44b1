"""jobctl.sh and the launcher (bootstrap/jobrun.py) without systemd (setsid + pidfile), against a
fake job: a bash program standing in for a user's. It logs its environment's attempt, then
either exits 75 on SIGTERM after "saving" (a job that saved), exits 0 on SIGTERM (as MaxText and
Orbax's guide do when preempted), ignores SIGTERM (a hung one), or exits 2 at once (bad input).
The job's `run` is a compound command line, so a shell layer sits between the launcher and the
program: it must wait for the program, never exit 143 while the program still saves.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from contract.job import parse
from infra.bundle_archive import PROJECT_ROOT
from localpod import procs

FAKE_JOB = """#!/bin/bash
echo "fake job attempt=$TPUPOD_ATTEMPT run=$TPUPOD_RUN_ID mode=$FAKE_MODE path=$PYTHONPATH"
case "$FAKE_MODE" in
fails) echo "unknown config key"; exit 2 ;;
hung) trap '' TERM ;;
zero) trap 'sleep 0.3; echo saved; exit 0' TERM ;;
*) trap 'sleep 0.5; echo saved; exit 75' TERM ;;
esac
step=0
while true; do step=$((step + 1)); echo "step $step"; sleep 0.1; done
"""
SPEC = r"""run: echo starting; bash fake-job.sh && echo after
progress: {regex: 'step (\d+)'}
"""


class Ctl:
    def __init__(self, root, mode="saves"):
        self.root = root
        bundle = root / "bundles" / ("0" * 64)
        (bundle / "bootstrap").mkdir(parents=True)
        for name in ("jobctl.sh", "jobctl_units.sh", "jobctl_standby.sh", "jobrun.py",
                     "jobrun_standby.py"):  # fmt: skip
            shutil.copy2(PROJECT_ROOT / "bootstrap" / name, bundle / "bootstrap")
        shutil.copytree(PROJECT_ROOT / "contract", bundle / "contract")  # the run dir's layout
        (bundle / ".venv" / "bin").mkdir(parents=True)
        (bundle / ".venv" / "bin" / "python").symlink_to(sys.executable)  # the launcher's
        (bundle / "job").mkdir()
        (bundle / "job" / "fake-job.sh").write_text(FAKE_JOB)
        (root / "current").symlink_to(f"bundles/{'0' * 64}")
        spec = parse(SPEC, "test").to_json()
        (root / "job.json").write_text(spec)
        (root / "job.venv").write_text(f"{bundle / '.venv'}\n")
        (root / "job.env").write_text(
            f"TPUPOD_RUN_ID=r1\nTPUPOD_PROCESS_ID=0\nTPUPOD_GRACE_S=10\nFAKE_MODE={mode}\n"
            f"TPUPOD_RUN_DIR=gs://b/runs/s/r1\nTPUPOD_STATUS_FILE={root / 'status.json'}\n"
            # no storage here: the log upload fails and says so once, the job runs on
            "STORAGE_EMULATOR_HOST=http://127.0.0.1:9\nGCE_METADATA_HOST=127.0.0.1:9\n"
        )
        self.lock = root / "libtpu_lockfile"

    def __call__(self, verb, stop_timeout=10, **extra):
        env = {
            "TPUPOD_NO_SYSTEMD": "1",  # as on a local pod's worker: never the host's systemd
            **extra,
            "PATH": os.environ["PATH"],
            "TPUPOD_ROOT": str(self.root),
            "TPUPOD_STOP_TIMEOUT": str(stop_timeout),
            "TPUPOD_LIBTPU_LOCKFILE": str(self.lock),
        }
        return subprocess.run(
            ["bash", str(self.root / "current" / "bootstrap" / "jobctl.sh"), verb],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def pid(self):
        try:
            return int((self.root / "job.pid").read_text())
        except FileNotFoundError:
            return None

    def log(self) -> str:
        path = self.root / "job.log"
        return path.read_text() if path.exists() else ""

    def wait_for(self, text: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert time.monotonic() < deadline, (text, self.log())
            time.sleep(0.05)


@pytest.fixture
def ctl(tmp_path):
    made = []

    def make(mode="saves"):
        made.append(Ctl(tmp_path / f"root{len(made)}", mode))
        return made[-1]

    yield make
    for c in made:  # whatever a test left running: the process group jobctl recorded
        pid = c.pid()
        if pid:  # a group id is not reused while the group has members: it is still ours
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_start_once_then_stop_waits_for_the_save_and_records_the_exit_code(ctl):
    c = ctl()
    assert c("status").stdout.strip() == "stopped"
    first = c("start", TPUPOD_ATTEMPT="4")
    assert first.returncode == 0 and "attempt 4" in first.stdout, first.stderr
    pid = c.pid()
    assert pid and os.getpgid(pid) == pid  # its own process group, for the group signals
    again = c("start")
    assert again.returncode == 0 and "already running" in again.stdout and c.pid() == pid
    status = c("status")
    assert status.returncode == 0 and status.stdout.strip() == f"running pid {pid}"
    c.wait_for("step 3")
    stop = c("stop")
    # bash sat between the launcher and the program: it waited, so the code is the program's
    assert stop.returncode == 0 and "exit code 75" in stop.stdout, (stop.stdout, c.log())
    assert not procs.alive(pid) and c.pid() is None
    assert (c.root / "job.exit").read_text().strip() == "75"
    assert c("status").stdout.strip() == "exited 75" and c("status").returncode == 3
    log = c.log()
    assert "fake job attempt=4 run=r1 mode=saves" in log and "saved" in log
    assert "job exited 75 after SIGTERM" in log
    assert float((c.root / "job.term").read_text()) > time.time() - 60  # the stop is recorded
    status = json.loads((c.root / "status.json").read_text())  # progress read from the output
    assert status["step"] >= 3 and status["source"] == "output"
    assert "bootstrap/jobkit" in log  # tpupod_job on the job's PYTHONPATH
    # A new start keeps the last exit readable and forgets the stop.
    assert c("start").returncode == 0
    assert (c.root / "job.last-exit").read_text().strip() == "75"
    assert not (c.root / "job.term").exists() and not (c.root / "job.exit").exists()
    assert c("stop").returncode == 0


def test_exit_0_after_sigterm_leaves_the_term_mark(ctl):
    c = ctl("zero")
    assert c("start").returncode == 0
    c.wait_for("step 2")
    assert "exit code 0" in c("stop").stdout
    assert (c.root / "job.term").exists()  # so the watcher judges it preempted, not done
    assert "\nafter\n" not in c.log()  # the rest of the command line does not run after it


def test_a_job_that_exits_at_once_is_a_launch_that_worked(ctl):
    """Never exit 1 (a failed launch): the job started, and job.exit holds its own failure, so
    the bootstrap's start-job phase is done and the watcher restarts the job instead of
    re-creating a healthy slice. Exit 3 when the failure came before start returned."""
    c = ctl("fails")
    start = c("start")
    assert start.returncode in (0, 3), (start.stdout, start.stderr)
    if start.returncode == 3:
        assert "job started and exited 2 at once" in start.stderr
    deadline = time.monotonic() + 10
    while c("status").stdout.strip() != "exited 2":
        assert time.monotonic() < deadline, c("status").stdout
        time.sleep(0.05)
    assert "unknown config key" in c.log()


@pytest.mark.parametrize("unit", [True, False])
def test_under_systemd_the_output_also_goes_to_the_journal(ctl, unit):
    """As a unit runs the launcher (`jobctl.sh __unit run-ID`: INVOCATION_ID set, stdout the
    journal) it also writes the job's output to its stdout; a SIGTERM does not cut it: the last
    lines and the code still arrive. The control: without the unit's mark, nothing there. (The
    units themselves: tests/bootstrap/test_standby_systemd.py, where no journald runs.)"""
    c = ctl()
    mark = {"INVOCATION_ID": "test"} if unit else {}
    launcher = subprocess.Popen(
        ["bash", str(c.root / "current" / "bootstrap" / "jobctl.sh"), "__unit", "run-1"],
        env={"PATH": os.environ["PATH"], "TPUPOD_ROOT": str(c.root), **mark},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    reaped = concurrent.futures.ThreadPoolExecutor(1).submit(launcher.communicate)  # as systemd
    c.wait_for("step 2")
    assert "exit code 75" in c("stop", TPUPOD_NO_SYSTEMD="1").stdout
    echoed = reaped.result(timeout=30)[0]
    assert ("saved" in echoed and "job exited 75" in echoed) is unit, echoed
    assert c.log().count("saved") == 1


def test_stop_escalates_to_sigkill_after_the_stop_timeout(ctl):
    c = ctl("hung")
    assert c("start").returncode == 0
    pid = c.pid()
    c.wait_for("step 1")
    t0 = time.monotonic()
    stop = c("stop", stop_timeout=1)
    assert stop.returncode == 0 and "SIGKILL" in stop.stdout, stop.stdout
    assert time.monotonic() - t0 >= 1
    assert not procs.alive(pid)
    assert (c.root / "job.exit").read_text().strip() == "137"


def test_a_stop_timeout_of_zero_kills_at_once(ctl):
    """A hung job's stop (ops.watch: hang_stop_timeout 0): SIGKILL with the SIGTERM, no wait."""
    c = ctl("hung")
    assert c("start").returncode == 0
    pid = c.pid()
    c.wait_for("step 1")
    stop = c("stop", stop_timeout=0)
    assert stop.returncode == 0 and "job still running after 0s: SIGKILL" in stop.stdout, (
        stop.stdout
    )
    assert not procs.alive(pid)
    assert (c.root / "job.exit").read_text().strip() == "137"


def test_clear_locks_waits_for_the_job_to_stop(ctl):
    c = ctl()
    c.lock.write_text("")
    assert c("start").returncode == 0
    refused = c("clear-locks")
    assert refused.returncode == 1 and c.lock.exists()
    assert c("stop").returncode == 0
    cleared = c("clear-locks")
    assert cleared.returncode == 0 and not c.lock.exists()


def test_a_stale_pidfile_is_never_taken_for_the_job(ctl):
    """After a reboot job.pid may name any process: here, this test's own."""
    c = ctl()
    (c.root / "job.pid").write_text(f"{os.getpid()}\n")
    assert c("status").stdout.strip() == "stopped"
    assert c("stop").stdout.strip() == "job not running"  # and this process lives on
    assert c("start").returncode == 0
    assert c.pid() not in (None, os.getpid())
    assert c("stop").returncode == 0


def test_a_job_whose_launcher_died_is_still_found_and_stopped(ctl):
    c = ctl()
    assert c("start").returncode == 0
    pid = c.pid()
    c.wait_for("fake job")
    os.kill(pid, signal.SIGKILL)  # the launcher only; the job lives on in its group
    procs.wait_gone(pid, None, timeout=5)
    assert c("status").stdout.strip() == f"running pid {pid}"
    assert c("bundle").stdout.strip() == "0" * 64
    assert "already running" in c("start").stdout
    assert c("stop").returncode == 0
    assert c("status").returncode == 3
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
