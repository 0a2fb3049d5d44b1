"""The parked side of a standby (tpupod_job.standby), through real interpreters and a real
socketpair: promoted, it runs the job as a cold `python -m MODULE ARGS` does (the differential
test: the job's view of itself is the same but for its pid); discarded, nothing of the job runs;
a preload that fails ends it. The control: the same comparison tells a job run the naive way
(runpy.run_module, not as __main__) from a cold one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tpupod_job.standby import LIBTPU_LOCKFILE

JOBKIT = Path(__file__).resolve().parents[2] / "bootstrap" / "jobkit"
PROBE = """
import json, os, sys
view = {"argv": sys.argv[1:], "argv0": os.path.basename(sys.argv[0]), "name": __name__,
        "spec": __spec__.name if __spec__ else None, "path0": sys.path[0], "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("JOB_", "TPUPOD_"))},
        "globals": sorted(k for k in globals() if not k.startswith("__")),
        "stdout": os.readlink("/proc/self/fd/1"), "flags": list(sys.flags)}
with open(os.environ["JOB_VIEW"], "w") as f:
    json.dump(view, f)
print("job ran", flush=True)
sys.exit(int(os.environ.get("JOB_EXIT", "0")))
"""


def job_dir(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    (job / "probe").mkdir(parents=True, exist_ok=True)
    (job / "probe" / "__init__.py").write_text("")
    (job / "probe" / "__main__.py").write_text(PROBE)
    return job


def environment(tmp_path: Path, attempt: int, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPUPOD_", "JOB_"))}
    env.update(PYTHONPATH=str(JOBKIT), TPUPOD_ATTEMPT=str(attempt), JOB_GONE="x",
               JOB_VIEW=str(tmp_path / f"view-{attempt}.json"), JOB_EXIT="3", **extra)  # fmt: skip
    return env


def cold(tmp_path: Path, env: dict, log: Path) -> int:
    with open(log, "ab") as out:
        return subprocess.run([sys.executable, "-m", "probe", "a", "b c"], cwd=job_dir(tmp_path),
                              env=env, stdout=out, stderr=out).returncode  # fmt: skip


def parked(tmp_path: Path, env: dict, preload: str = "json,email.message"):
    ours, theirs = socket.socketpair()
    env = {**env, "TPUPOD_STANDBY_FD": str(theirs.fileno()), "TPUPOD_STANDBY_PRELOAD": preload}
    with open(tmp_path / "standby.log", "ab") as log:
        child = subprocess.Popen([sys.executable, "-m", "tpupod_job.standby"],
                                 cwd=job_dir(tmp_path), env=env, stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=log, pass_fds=(theirs.fileno(),))  # fmt: skip
    theirs.close()
    return child, ours


def test_a_promoted_standby_runs_the_job_as_a_cold_start_does(tmp_path):
    wanted = environment(tmp_path, 2)
    wanted.pop("JOB_GONE")  # the attempt's environment lost a variable the standby started with
    wanted["JOB_NEW"] = "1"
    assert cold(tmp_path, wanted, tmp_path / "cold.log") == 3
    cold_view = json.loads((tmp_path / "view-2.json").read_text())

    base = environment(tmp_path, 1)
    child, control = parked(tmp_path, base)
    hello = json.loads(control.makefile("rb").readline())["parked"]
    assert hello["pid"] == child.pid and hello["imports_s"] >= 0
    go = {"base": base, "env": wanted, "log": str(tmp_path / "attempt-2.log"),
          "module": "probe", "script": None, "args": ["a", "b c"]}  # fmt: skip
    control.sendall(json.dumps({"go": go}).encode() + b"\n")
    assert child.wait(timeout=60) == 3  # the job's own exit code
    view = json.loads((tmp_path / "view-2.json").read_text())
    assert view["stdout"].endswith("attempt-2.log") and cold_view["stdout"].endswith("cold.log")
    view["stdout"] = cold_view["stdout"] = "the attempt's log"
    promoted = float(view["env"].pop("TPUPOD_STANDBY_PROMOTED_AT"))  # the one addition: when
    assert abs(promoted - time.time()) < 60 and "TPUPOD_STANDBY_PROMOTED_AT" not in cold_view["env"]
    assert view == cold_view
    assert view["env"]["TPUPOD_ATTEMPT"] == "2" and "JOB_GONE" not in view["env"]
    assert (tmp_path / "attempt-2.log").read_text() == "job ran\n"
    assert "TPUPOD_STANDBY_FD" not in view["env"]


def test_the_comparison_tells_a_naive_in_process_run_from_a_cold_one(tmp_path):
    """Control: runpy.run_module without the `-m` path (not __main__, no argv) differs."""
    env = environment(tmp_path, 2)
    cold(tmp_path, env, tmp_path / "cold.log")
    cold_view = json.loads((tmp_path / "view-2.json").read_text())
    naive = "import runpy, sys; sys.argv = ['x', 'a', 'b c']; runpy.run_module('probe')"
    subprocess.run([sys.executable, "-c", naive], cwd=tmp_path / "job", env=env)
    view = json.loads((tmp_path / "view-2.json").read_text())
    assert view["name"] != cold_view["name"] and view["path0"] != cold_view["path0"]


def test_a_standby_discarded_before_its_go_runs_nothing_of_the_job(tmp_path):
    child, control = parked(tmp_path, environment(tmp_path, 1))
    json.loads(control.makefile("rb").readline())
    control.close()  # the launcher gone, or the standby discarded
    assert child.wait(timeout=60) == 0
    assert not (tmp_path / "view-1.json").exists()


def test_a_preload_that_fails_ends_the_standby_before_it_parks(tmp_path):
    child, control = parked(tmp_path, environment(tmp_path, 1), preload="json,no_such_module")
    assert control.makefile("rb").readline() == b""  # never parked
    assert child.wait(timeout=60) != 0
    assert "No module named 'no_such_module'" in (tmp_path / "standby.log").read_text()


def test_imports_that_hold_the_accelerator_end_the_standby_before_it_parks(tmp_path):
    """A preload that opens libtpu's lockfile (as one that started the TPU backend would) would
    contend with the job it stands by for: it does not park. The control is the same preload
    with the lockfile elsewhere: it parks."""
    lock = tmp_path / "libtpu_lockfile"
    (job_dir(tmp_path) / "grab.py").write_text(f"held = open({str(lock)!r}, 'a')\n")
    for where, parks in ((lock, False), (tmp_path / "elsewhere", True)):
        env = environment(tmp_path, 1, TPUPOD_LIBTPU_LOCKFILE=str(where))
        child, control = parked(tmp_path, env, preload="json,grab")
        said = control.makefile("rb").readline()
        assert bool(said) is parks, (tmp_path / "standby.log").read_text()
        control.close()
        assert (child.wait(timeout=60) == 0) is parks
    log = (tmp_path / "standby.log").read_text()
    assert f"standby: its imports opened {lock}, the running job's accelerator" in log
    # The default is the one `jobctl clear-locks` removes.
    jobctl = (JOBKIT.parent / "jobctl.sh").read_text()
    assert f'LOCKFILE="${{TPUPOD_LIBTPU_LOCKFILE:-{LIBTPU_LOCKFILE}}}"' in jobctl


def test_the_prepare_hook_re_execs_once_with_its_variables_same_pid(tmp_path):
    """The job's `prepare` (the built-in trainer's allocator) gives the interpreter its start-up
    variables before any import: one re-exec, the same pid, the same socket; the job keeps
    them (the attempt's environment does not name them, as a cold start's re-exec keeps its own)."""
    job = job_dir(tmp_path)
    (job / "hook.py").write_text(
        "def prep(environ):\n"
        "    return None if environ.get('JOB_PREPARED') else {**environ, 'JOB_PREPARED': '1'}\n"
    )
    base = environment(tmp_path, 1, TPUPOD_STANDBY_PREPARE="hook:prep")
    child, control = parked(tmp_path, base)
    assert json.loads(control.makefile("rb").readline())["parked"]["pid"] == child.pid
    wanted = {**environment(tmp_path, 2), "TPUPOD_STANDBY_PREPARE": "hook:prep"}
    go = {"base": base, "env": wanted, "log": str(tmp_path / "attempt-2.log"),
          "module": "probe", "script": None, "args": []}  # fmt: skip
    control.sendall(json.dumps({"go": go}).encode() + b"\n")
    assert child.wait(timeout=60) == 3
    env = json.loads((tmp_path / "view-2.json").read_text())["env"]
    ours = {k for k in env if k.startswith("TPUPOD_STANDBY")}
    assert env["JOB_PREPARED"] == "1" and ours == {"TPUPOD_STANDBY_PROMOTED_AT"}  # for the job
