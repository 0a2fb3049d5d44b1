"""A standby through jobctl.sh and the launcher without systemd (setsid): the job's first
progress parks its next attempt (imports done, own session); a restart's stop keeps it and the
start promotes it: job.pid is the parked launcher, the job runs in the parked interpreter as the
new attempt, its output in the attempt's log. Negative controls: a stop without keep discards it
(the next start is cold), and a changed job.env is refused (cold, with the reason)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time

import pytest

from contract.job import parse
from infra.bundle_archive import PROJECT_ROOT
from tests.bootstrap.test_jobctl import Ctl


@pytest.fixture
def ctl(tmp_path):
    """Roots of our own; after the test, every process running from one of them (the job, a
    standby parked or still parking: each in a session of its own) is killed by its pid."""
    made = []

    def make():
        made.append(Ctl(tmp_path / f"root{len(made)}"))
        return made[-1]

    yield make
    ours = str(tmp_path.resolve())
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/cwd").startswith(ours):
                    os.kill(int(entry), signal.SIGKILL)


FAKE = """import json, os, signal, sys, time
preloaded = "email.message" in sys.modules  # in the preload list; no job imports it
nice = {t: os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
with open(os.environ["FAKE_RECORD"], "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "attempt": os.environ["TPUPOD_ATTEMPT"],
                        "preloaded": preloaded, "argv": sys.argv[1:], "nice": nice,
                        "unit": os.environ.get("INVOCATION_ID")}) + "\\n")
signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))
step = 0
while True:
    step += 1
    print(f"step {step}", flush=True)
    time.sleep(0.1)
"""
SPEC = r"""run: exec python -m fakejob --x 1
progress: {regex: 'step (\d+)'}
standby: {preload: [json, email.message]}
"""


def standby_ctl(ctl, spec: str = SPEC, modules: dict[str, str] | None = None) -> Ctl:
    c = ctl()
    bundle = c.root / "current"
    shutil.copytree(PROJECT_ROOT / "bootstrap" / "jobkit", bundle / "bootstrap" / "jobkit")
    (bundle / "job" / "fakejob").mkdir()
    (bundle / "job" / "fakejob" / "__main__.py").write_text(FAKE)
    for name, text in (modules or {}).items():
        (bundle / "job" / f"{name}.py").write_text(text)
    (c.root / "job.json").write_text(parse(spec, "test").to_json())
    with open(c.root / "job.env", "a") as f:
        f.write(f"FAKE_RECORD={c.root / 'record.jsonl'}\n")
    return c


def records(c: Ctl) -> list[dict]:
    path = c.root / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def await_standby(c: Ctl, parked: bool = True, timeout: float = 30.0) -> dict:
    """standby.json once it says `parked` (the imports done), or once it exists."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            said = json.loads((c.root / "standby.json").read_text())
            if said["parked"] or not parked:
                return said
        assert time.monotonic() < deadline, (c.log(), (c.root / "logs" / "standby.log"))
        time.sleep(0.05)


def attempts(c: Ctl, count: int) -> list[dict]:
    deadline = time.monotonic() + 20
    while len(records(c)) < count:
        assert time.monotonic() < deadline, c.log()
        time.sleep(0.05)
    return records(c)


def test_a_restart_promotes_the_parked_attempt_and_a_plain_stop_discards_it(ctl):
    c = standby_ctl(ctl)
    # Started from some unit of the host's: a local worker's job is in none (no journal echo).
    assert c("start", TPUPOD_ATTEMPT="1", INVOCATION_ID="the-hosts").returncode == 0
    standby = await_standby(c)
    assert c("stop", TPUPOD_KEEP_STANDBY="1").returncode == 0
    started = c("start", TPUPOD_ATTEMPT="2")
    assert started.returncode == 0 and "the standby" in started.stdout, started.stderr
    assert c.pid() == standby["pid"]
    c.wait_for("promoted the standby")
    cold_run, promoted = attempts(c, 2)
    assert cold_run == {"pid": cold_run["pid"], "attempt": "1", "preloaded": False,
                        "argv": ["--x", "1"], "nice": cold_run["nice"], "unit": None}  # fmt: skip
    assert promoted["pid"] == standby["child"] and promoted["attempt"] == "2"
    assert promoted["preloaded"] and promoted["argv"] == ["--x", "1"]
    c.wait_for("step 3")  # the promoted job's output: into job.log through its attempt's log
    assert "step 1\n" in (c.root / "logs" / "job-attempt-2.log").read_text()
    await_standby(c)  # the promoted job's progress parks the next one
    stopped = c("stop")  # not a restart: the parked one goes too
    assert stopped.returncode == 0 and (c.root / "job.exit").read_text().strip() == "75"
    assert not (c.root / "standby.json").exists()
    assert c("start", TPUPOD_ATTEMPT="3").returncode == 0
    attempts(c, 3)
    assert records(c)[2]["preloaded"] is False  # control: cold
    assert c("stop").returncode == 0


def test_a_changed_job_env_is_refused_and_the_start_is_cold(ctl):
    c = standby_ctl(ctl)
    assert c("start", TPUPOD_ATTEMPT="1").returncode == 0
    standby = await_standby(c)
    assert c("stop", TPUPOD_KEEP_STANDBY="1").returncode == 0
    with open(c.root / "job.env", "a") as f:
        f.write("NEW_SETTING=1\n")  # a rerun of the bootstrap rewrote it
    started = c("start", TPUPOD_ATTEMPT="2")
    assert started.returncode == 0, started.stderr
    assert "standby refused: the bundle or the bootstrap's files changed" in started.stderr
    assert c.pid() != standby["pid"]
    attempts(c, 2)
    assert records(c)[1]["preloaded"] is False and records(c)[1]["attempt"] == "2"
    assert c("stop").returncode == 0


SLOW_SPEC = SPEC.replace("[json, email.message]", "[json, email.message, slowimport]")
# The import lasts until the test releases it (capped at 120 s), not a fixed 5 s: a stop, a start
# and a stop must all land while it imports, however loaded the machine.
SLOW = """import os, time
release = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slowimport.release")
deadline = time.monotonic() + 120
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def release_slow_import(c: Ctl) -> None:
    (c.root / "current" / "job" / "slowimport.release").touch()


@pytest.mark.parametrize("imports", ["done", "failed", "stopped"])
def test_a_restart_during_the_standbys_imports_promotes_it(ctl, imports):
    """A fault soon after a start finds the standby still importing (a 5 s import here): the
    start promotes it all the same (job.pid at once, the job once the imports are done).
    Controls: imports that fail after the promotion start the attempt cold; a stop before they
    are done ends it as the stop asked, with no job started."""
    slow = SLOW + ("raise ImportError('slowimport: broken')\n" if imports == "failed" else "")
    c = standby_ctl(ctl, SLOW_SPEC, {"slowimport": slow})
    assert c("start", TPUPOD_ATTEMPT="1").returncode == 0
    importing = await_standby(c, parked=False)
    assert importing["parked"] is False
    assert c("stop", TPUPOD_KEEP_STANDBY="1").returncode == 0
    started = c("start", TPUPOD_ATTEMPT="2")
    assert started.returncode == 0 and "the standby" in started.stdout, started.stderr
    assert c.pid() == importing["pid"]
    if imports == "stopped":  # at once: its imports are not released
        assert c("stop").returncode == 0
        assert (c.root / "job.exit").exists() and len(records(c)) == 1, c.log()  # no job ran
        assert "stopped before the standby's imports were done" in c.log()
        return
    release_slow_import(c)
    c.wait_for("while it imports: at full priority")  # in job.log once the job runs
    second = attempts(c, 2)[1]
    assert second["attempt"] == "2" and second["argv"] == ["--x", "1"]
    if imports == "done":
        assert second["pid"] == importing["child"] and second["preloaded"]
        c.wait_for("its imports done")
    else:
        assert second["pid"] != importing["child"] and not second["preloaded"]
        c.wait_for("a cold start")
    c.wait_for("step 3")
    assert c("stop").returncode == 0


THREAD_SPEC = SPEC.replace("[json, email.message]", "[json, email.message, threadpark]")
THREAD = "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"


def nice_of(pid: int) -> dict[str, int]:
    return {t: os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(os.geteuid() != 0, reason="the standby parks at low priority as root only")
def test_a_promoted_standby_runs_every_thread_at_the_cold_starts_priority(ctl):
    """The parked imports run at nice 19 (beside a training job); promoted, every thread of the
    interpreter, one its preload started included, is back at the cold start's priority. The
    control is the parked interpreter itself: before its promotion each of its threads reads 19,
    so a launcher that skipped the renice would fail here."""
    c = standby_ctl(ctl, THREAD_SPEC, {"threadpark": THREAD})
    assert c("start", TPUPOD_ATTEMPT="1").returncode == 0
    standby = await_standby(c)
    parked = nice_of(standby["child"])
    assert len(parked) >= 2 and set(parked.values()) == {19}, parked
    assert c("stop", TPUPOD_KEEP_STANDBY="1").returncode == 0
    assert c("start", TPUPOD_ATTEMPT="2").returncode == 0
    cold_run, promoted = attempts(c, 2)
    assert promoted["pid"] == standby["child"] and promoted["preloaded"]
    assert set(promoted["nice"]) >= set(parked)  # the preload's thread among them
    ours = os.getpriority(os.PRIO_PROCESS, 0)  # what the launchers start at, as jobctl's caller
    assert set(promoted["nice"].values()) == set(cold_run["nice"].values()) == {ours}
    assert c("stop").returncode == 0
