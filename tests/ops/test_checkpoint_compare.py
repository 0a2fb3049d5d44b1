"""The bitwise comparison (ops.commands.checkpoint_compare) can fail: examples/jobs/flax-plain's program,
run directly (one process, local checkpoint directories), interrupted halfway and resumed the
right way equals the run never interrupted; resumed at the latest step instead of the one after
it (wrong-resume, as the loop in Orbax's guide does) it does NOT, and the comparison names the
leaves. The same program and comparison on the pod, under faults: tests/e2e/test_jobs.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ops.commands.checkpoint_compare import compare

PROGRAM = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "flax-plain" / "train.py"
STEPS, HALF = 12, 6


def train(*runs: tuple[Path, int, tuple[str, ...]]) -> None:
    """Runs of the program side by side (each: checkpoint directory, steps, extra flags)."""
    started = []
    for directory, steps, extra in runs:
        env = {**os.environ, "TPUPOD_CHECKPOINT_DIR": str(directory), "JAX_PLATFORMS": "cpu",
               "TPUPOD_NUM_PROCESSES": "1"}  # fmt: skip
        command = [sys.executable, str(PROGRAM), "--steps", str(steps), "--save-every", "3",
                   "--width", "32", *extra]  # fmt: skip
        started.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True))  # fmt: skip
    for proc in started:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]


def test_a_right_resume_is_equal_and_a_wrong_one_is_not(tmp_path):
    whole, right, wrong = tmp_path / "whole", tmp_path / "right", tmp_path / "wrong"
    train((whole, STEPS, ()), (right, HALF, ()), (wrong, HALF, ()))
    train((right, STEPS, ()), (wrong, STEPS, ("--resume-from-latest",)))
    equal = compare(str(whole), str(right))
    assert equal.equal and equal.step_a == equal.step_b == STEPS and equal.leaves >= 10
    assert equal.lines() == [f"final steps {STEPS} and {STEPS}: {equal.leaves} arrays and 0 files "
                             "compared: bitwise equal"]  # fmt: skip
    differ = compare(str(whole), str(wrong))
    assert not differ.equal and differ.step_a == differ.step_b == STEPS
    assert any(d.startswith("default/params/") for d in differ.differ), differ.differ
    assert differ.lines()[0].endswith(f"NOT equal, {len(differ.differ)} differ")
    shorter = compare(str(whole), str(tmp_path / "missing"))
    assert not shorter.equal  # nothing committed there: never "equal"
