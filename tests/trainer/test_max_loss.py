"""A time bound on the work a preemption without notice can cost: with step-based saves off,
`--max-loss-s` (the job's max_loss_minutes, $TPUPOD_MAX_LOSS_S) still saves every so often; a
run without it saves only at the end (the negative control)."""

from __future__ import annotations

import pytest
from trainer_testlib import run_ok

from trainer.config import BadInput, bound_loss, load_config

ARGS = ["--config", "tiny", "--steps", 300, "--set", "checkpoint_every=0",
        "--set", "keep_latest=1000", "--set", "log_every=50"]  # fmt: skip


def saved_steps(workdir) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def test_the_time_bound_saves_whatever_the_step_interval(spawn, tmp_path):
    bounded = run_ok(spawn, [*ARGS, "--workdir", tmp_path / "a", "--max-loss-s", 1], tmp_path,
                     "a")  # fmt: skip
    steps = saved_steps(tmp_path / "a")
    seconds = bounded.lines()[-1]["time"] - bounded.lines()[0]["time"]
    assert len(steps) >= 3 and steps[-1] == 300, (steps, seconds)
    run_ok(spawn, [*ARGS, "--workdir", tmp_path / "b"], tmp_path, "b")
    assert saved_steps(tmp_path / "b") == [300]


def test_the_bound_only_tightens():
    tiny = load_config("tiny")
    assert (
        tiny.checkpoint_every_seconds == 0 and bound_loss(tiny, 300).checkpoint_every_seconds == 300
    )
    tight = load_config("tiny", ["checkpoint_every_seconds=60"])
    assert bound_loss(tight, 300).checkpoint_every_seconds == 60
    assert bound_loss(load_config("1b"), 300).checkpoint_every_seconds == 300
    assert bound_loss(tiny, None) is tiny
    with pytest.raises(BadInput, match="--max-loss-s 0"):
        bound_loss(tiny, 0)
