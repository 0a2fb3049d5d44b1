"""What a hang's forensics read from a live job, per the job's `hang_stacks`: the worker's own
script (ops.fleet.forensics.script) run here under bash, as `watch` runs it on a worker, against a
real process tree (job.pid a bash wrapper, its child Python in a known function) and the real
py-spy. `python` (the default): every frame's arguments and locals, no native frames; `native`:
both; a stopped process: read without suspending it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.job import JobSpec
from ops.fleet.forensics import script
from ops.fleet.job_status import JobRules

PY_SPY = Path(sys.executable).with_name("py-spy")
JOB = """import time
def stuck_in_known_function(argument=41):
    a_local = argument + 1
    while True:
        time.sleep(0.1)
stuck_in_known_function()
"""

pytestmark = pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy not installed here")


@pytest.fixture
def job(tmp_path: Path):
    """A worker root whose job runs: job.pid names its launcher, a bash wrapper."""
    root = tmp_path / "tpupod"
    (root / "current" / ".venv" / "bin").mkdir(parents=True)
    (root / "current" / ".venv" / "bin" / "py-spy").symlink_to(PY_SPY)
    (root / "job.py").write_text(JOB)
    (root / "job.log").write_text("step 7: about to wait forever\n")
    launcher = subprocess.Popen(
        ["bash", "-c", f'"{sys.executable}" "{root / "job.py"}"; true'], start_new_session=True
    )
    (root / "job.pid").write_text(f"{launcher.pid}\n")
    try:
        child = _child_of(launcher.pid)
        yield root, child
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)


def _child_of(pid: int) -> int:
    """The launcher's Python child, once py-spy sees it inside the known function."""
    deadline = time.time() + 20
    while time.time() < deadline:
        for kid in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            dump = subprocess.run(
                [str(PY_SPY), "dump", "--pid", kid], capture_output=True, text=True
            )
            if "stuck_in_known_function" in dump.stdout:
                return int(kid)
        time.sleep(0.1)
    raise AssertionError("the job's Python child never reached its known function")


def capture(root: Path, native: bool) -> str:
    out = subprocess.run(
        ["bash", "-c", script(native)],
        env={**os.environ, "TPUPOD_ROOT": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_python_stacks_keep_locals_without_natives(job):
    root, _ = job
    text = capture(root, native=False)
    assert "stuck_in_known_function" in text
    assert "argument: 41" in text and "a_local: 42" in text  # arguments and locals
    assert "libc.so" not in text and "libpython" not in text  # no native frames
    assert "step 7: about to wait forever" in text  # the log tail


def test_native_stacks_when_the_job_asks(job):
    root, _ = job
    text = capture(root, native=True)
    assert "stuck_in_known_function" in text and "a_local: 42" in text
    assert "libc.so" in text or "libpython" in text  # the control: natives read, and seen


def test_a_stopped_job_is_read_without_suspending_it(job):
    root, child = job
    os.kill(child, signal.SIGSTOP)
    text = capture(root, native=True)
    assert "process stopped" in text and "stuck_in_known_function" in text
    assert "a_local: 42" in text  # stopped, it runs nothing: its locals read as they are


def test_the_job_spec_chooses_and_python_is_the_default():
    assert not JobRules.of(JobSpec(run="python train.py")).native_stacks
    assert JobRules.of(JobSpec(run="python train.py", hang_stacks="native")).native_stacks
    with pytest.raises(ValueError, match="hang_stacks"):
        JobSpec(run="python train.py", hang_stacks="gdb")
