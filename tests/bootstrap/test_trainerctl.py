"""trainerctl.sh without systemd (setsid + pidfile), against a fake trainer process.

The fake is a bash script standing in for `.venv/bin/python`: it logs its arguments, then
either exits 75 on SIGTERM (a trainer that saved), ignores SIGTERM (a hung one) or exits 2 at
once (bad input).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time

import pytest

from infra.bundle_archive import PROJECT_ROOT
from localpod import procs

FAKE_PYTHON = """#!/bin/bash
echo "fake python $* mode=$FAKE_MODE"
if [ "$FAKE_MODE" = fails ]; then echo "unknown config key"; exit 2; fi
if [ "$FAKE_MODE" = hung ]; then trap '' TERM; else trap 'sleep 0.3; echo saved; exit 75' TERM; fi
while true; do sleep 0.1; done
"""


class Ctl:
    def __init__(self, root, mode="saves"):
        self.root = root
        bundle = root / "bundles" / "fake"
        (bundle / "bootstrap").mkdir(parents=True)
        shutil.copy2(PROJECT_ROOT / "bootstrap" / "trainerctl.sh", bundle / "bootstrap")
        python = bundle / ".venv" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(FAKE_PYTHON)
        python.chmod(0o755)
        (root / "current").symlink_to("bundles/fake")
        (root / "trainer.env").write_text(
            f"TPUPOD_TRAINER_ARGS=--config tiny --steps 3\nFAKE_MODE={mode}\n"
        )
        self.lock = root / "libtpu_lockfile"

    def __call__(self, verb, stop_timeout=10, **extra):
        env = {
            **extra,
            "PATH": os.environ["PATH"],
            "TPUPOD_ROOT": str(self.root),
            "TPUPOD_STOP_TIMEOUT": str(stop_timeout),
            "TPUPOD_LIBTPU_LOCKFILE": str(self.lock),
        }
        return subprocess.run(
            ["bash", str(self.root / "current" / "bootstrap" / "trainerctl.sh"), verb],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def pid(self):
        try:
            return int((self.root / "trainer.pid").read_text())
        except FileNotFoundError:
            return None


@pytest.fixture
def ctl(tmp_path):
    made = []

    def make(mode="saves"):
        made.append(Ctl(tmp_path / f"root{len(made)}", mode))
        return made[-1]

    yield make
    for c in made:  # whatever a test left running: the process group trainerctl recorded
        pid = c.pid()
        if pid:  # a group id is not reused while the group has members: it is still ours
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_start_once_then_stop_records_the_exit_code(ctl):
    c = ctl()
    assert c("status").stdout.strip() == "stopped"
    first = c("start")
    assert first.returncode == 0, first.stderr
    pid = c.pid()
    assert pid and os.getpgid(pid) == pid  # its own process group, for the group signals
    again = c("start")
    assert again.returncode == 0 and "already running" in again.stdout and c.pid() == pid
    status = c("status")
    assert status.returncode == 0 and status.stdout.strip() == f"running pid {pid}"
    stop = c("stop")
    assert stop.returncode == 0 and "exit code 75" in stop.stdout, stop.stdout
    assert not procs.alive(pid) and c.pid() is None
    assert (c.root / "trainer.exit").read_text().strip() == "75"
    assert c("status").stdout.strip() == "exited 75" and c("status").returncode == 3
    log = (c.root / "trainer.log").read_text()
    assert "fake python -m trainer --config tiny --steps 3 mode=saves" in log
    assert "saved" in log


def test_a_trainer_that_exits_at_once_is_started_but_says_so(ctl):
    """Exit 3, not 1: the launch worked and trainer.exit holds the trainer's own failure, so the
    bootstrap's start-trainer phase is done and the watcher restarts the trainer instead of
    re-creating a healthy slice."""
    c = ctl("fails")
    start = c("start")
    assert start.returncode == 3, (start.stdout, start.stderr)
    assert "trainer started and exited 2 at once" in start.stderr
    assert c("status").stdout.strip() == "exited 2"
    assert "unknown config key" in (c.root / "trainer.log").read_text()


def test_the_journal_tee_outlives_sigterm(ctl):
    """Under systemd (INVOCATION_ID set) output also goes through tee, which the unit's SIGTERM
    reaches too: the trainer must still write its last lines and exit 75, not die of SIGPIPE."""
    c = ctl()
    assert c("start", INVOCATION_ID="test").returncode == 0
    assert "exit code 75" in c("stop").stdout
    assert "saved" in (c.root / "trainer.log").read_text()


def test_stop_escalates_to_sigkill_after_the_stop_timeout(ctl):
    c = ctl("hung")
    assert c("start").returncode == 0
    pid = c.pid()
    t0 = time.monotonic()
    stop = c("stop", stop_timeout=1)
    assert stop.returncode == 0 and "SIGKILL" in stop.stdout, stop.stdout
    assert time.monotonic() - t0 >= 1
    assert not procs.alive(pid)
    assert (c.root / "trainer.exit").read_text().strip() == "137"


def test_clear_locks_waits_for_the_trainer_to_stop(ctl):
    c = ctl()
    c.lock.write_text("")
    assert c("start").returncode == 0
    refused = c("clear-locks")
    assert refused.returncode == 1 and c.lock.exists()
    assert c("stop").returncode == 0
    cleared = c("clear-locks")
    assert cleared.returncode == 0 and not c.lock.exists()


def test_a_stale_pidfile_is_never_taken_for_the_trainer(ctl):
    """After a reboot trainer.pid may name any process: here, this test's own."""
    c = ctl()
    (c.root / "trainer.pid").write_text(f"{os.getpid()}\n")
    assert c("status").stdout.strip() == "stopped"
    assert c("stop").stdout.strip() == "trainer not running"  # and this process lives on
    assert c("start").returncode == 0
    assert c.pid() not in (None, os.getpid())
    assert c("stop").returncode == 0


def test_a_trainer_whose_wrapper_died_is_still_found_and_stopped(ctl):
    c = ctl()
    assert c("start").returncode == 0
    pid = c.pid()
    deadline = time.monotonic() + 10  # the wrapper has started the trainer
    while "fake python" not in (c.root / "trainer.log").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)  # the wrapper only; the trainer lives on in its group
    procs.wait_gone(pid, None, timeout=5)
    assert c("status").stdout.strip() == f"running pid {pid}"
    assert c("bundle").stdout.strip() == "fake"
    assert "already running" in c("start").stdout
    assert c("stop").returncode == 0
    assert c("status").returncode == 3
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
