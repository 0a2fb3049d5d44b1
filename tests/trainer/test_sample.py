"""`python -m trainer sample` on the default (byte-level) path: text from a committed step, the
step chosen with --step, and a missing step or workdir as one line, exit 2. (Sampling a BPE run,
decoded with its own tokenizer: test_data_train.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
from trainer_testlib import REPO, run_ok, trainer_env


def sample(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "trainer", "sample", *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, env=trainer_env(), capture_output=True, text=True,
                          timeout=180)  # fmt: skip


@pytest.mark.slow  # sampling is not on the recovery path; CI stays under 20 minutes: `pytest -m slow`
def test_sample_from_a_byte_level_run(spawn, tmp_path):
    wd = tmp_path / "run"
    run_ok(spawn, ["--config", "tiny", "--steps", 6, "--workdir", wd], tmp_path, "train")

    done = sample("--workdir", wd, "--prompt", "import ", "--tokens", 16, "--temperature", 0)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("import ") and "# step 6, temperature 0" in done.stderr
    again = sample("--workdir", wd, "--prompt", "import ", "--tokens", 16, "--temperature", 0)
    assert again.stdout == done.stdout  # greedy: the same text every time

    earlier = sample("--workdir", wd, "--step", 5, "--prompt", "x", "--tokens", 4)
    assert earlier.returncode == 0 and "# step 5," in earlier.stderr, earlier.stderr[-2000:]

    for args, expected in [
        (["--workdir", wd, "--step", 3], "step 3 is not a committed checkpoint"),
        (["--workdir", tmp_path / "nothing"], "no checkpoints in"),
    ]:
        bad = sample(*args, "--prompt", "x")
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and expected in lines[0], bad.stderr
