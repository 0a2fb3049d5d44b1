"""Single-process training: loss falls, determinism per seed, status file, compile cache, the
JSON-lines contract (timed events, the peak probe after the first step, its cache), and bad input
as one line with exit code 2."""

from __future__ import annotations

import json

import pytest
from trainer_testlib import run_ok, summary

from trainer.status import read_status

STEPS = 12


def test_tiny_trains_deterministically(spawn, tmp_path):
    peak_env = {"TPUPOD_CACHE_DIR": str(tmp_path / "peak-cache")}
    a = run_ok(
        spawn,
        [
            "--config",
            "tiny",
            "--workdir",
            tmp_path / "a",
            "--steps",
            STEPS,
            "--status-file",
            tmp_path / "a.status",
        ],
        tmp_path,
        "a",
        env=peak_env,
    )
    losses = [r["loss"] for r in a.lines() if "loss" in r and "event" not in r]
    assert len(losses) == STEPS  # tiny logs every step
    assert losses[-1] < losses[0] - 1.0, losses
    lines = a.lines()
    assert [r.get("event") for r in lines[:2]] == ["started", "jax_initialized"]
    assert lines[0]["process_start"] <= lines[0]["time"] and lines[1]["seconds"] > 0
    times = [r["time"] for r in lines]
    assert times == sorted(times), "every line carries its unix time, in order"
    # An empty peak cache: the probe runs after the first step, which is logged without MFU.
    first = next(r for r in lines if r.get("step") == 1)
    for key in ("learning_rate", "grad_norm", "tokens_per_s", "step_time", "model_flops_per_s"):
        assert key in first
    assert "mfu" not in first and [r.get("event") for r in lines].count("peak_measured") == 1
    last = next(r for r in lines if r.get("step") == STEPS)
    assert last["peak_source"] == "measured:jnp.dot" and 0 < last["mfu"] < 1
    s = summary(tmp_path / "a")
    assert s["final_step"] == STEPS and s["tokens_seen"] == STEPS * 8 * 64
    assert len(s["params_fingerprint"]) == 64 and s["wall_time_s"] > 0
    status = read_status(tmp_path / "a.status")
    assert status.state == "done" and status.exit_code == 0 and status.step == STEPS
    assert status.last_checkpoint == STEPS and status.compile_cache_hit is False
    assert list((tmp_path / "a" / "tb").iterdir()), "tensorboard events expected"

    # Same seed, fresh workdir: same fingerprint; the shared compile cache serves the step, and
    # the peak cache the peak (MFU from step 1, no probe).
    args = ["--config", "tiny", "--workdir", tmp_path / "b", "--steps", STEPS]
    b = run_ok(spawn, args, tmp_path, "b", env=peak_env)
    assert summary(tmp_path / "b")["params_fingerprint"] == s["params_fingerprint"]
    compiled = next(r for r in b.lines() if r.get("event") == "compiled")
    assert compiled["compile_cache_hit"] is True
    # the step was lowered and its entry loaded on a thread while the state was made
    assert compiled["lowered_beside_restore_s"] > 0
    first = next(r for r in b.lines() if r.get("step") == 1)
    assert first["peak_source"].startswith("measured:jnp.dot (cached ")
    assert first["peak_flops"] == last["peak_flops"]
    assert not any(r.get("event") == "peak_measured" for r in b.lines())

    run_ok(
        spawn,
        ["--config", "tiny", "--workdir", tmp_path / "c", "--steps", STEPS, "--seed", 1],
        tmp_path,
        "c",
    )
    assert summary(tmp_path / "c")["params_fingerprint"] != s["params_fingerprint"]


def _bad(spawn, tmp_path, name, args, needle, devices=1):
    t = spawn(args, tmp_path, name, devices)
    assert t.wait() == 2, t.stderr
    err = t.stderr.strip().splitlines()
    assert err and err[-1].startswith("error: ") and needle in err[-1], err
    assert "Traceback" not in t.stderr
    return err[-1]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--config", "nope"], "unknown config 'nope'"),
        (["--config", "tiny", "--set", "bogus=1"], "unknown config key 'bogus'"),
        (["--config", "tiny", "--set", "batch_size=many"], "expected int"),
    ],
)
def test_bad_config(spawn, tmp_path, args, needle):
    _bad(spawn, tmp_path, "bad", [*args, "--workdir", tmp_path / "w"], needle)


def test_bad_runtime_input(spawn, tmp_path):
    """Failures found after start-up: each one line, exit 2, no traceback."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _bad(
        spawn, tmp_path, "workdir", ["--config", "tiny", "--workdir", blocker / "w"], "not writable"
    )
    _bad(
        spawn,
        tmp_path,
        "divisible",
        ["--config", "tiny", "--workdir", tmp_path / "w", "--set", "batch_size=6"],
        "not divisible",
        devices=4,
    )

    data = tmp_path / "data"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("hello tpupod\n" * 20)
    from trainer.data import main as data_main

    assert data_main(["prepare", "--source", str(tmp_path / "src"), "--out", str(data)]) == 0
    _bad(
        spawn,
        tmp_path,
        "short",
        ["--config", "tiny", "--workdir", tmp_path / "w", "--set", f"data={data}"],
        "fewer than one batch",
    )
    shard = data / json.loads((data / "index.json").read_text())["shards"][0]["name"]
    shard.write_bytes(b"corrupt" + shard.read_bytes()[7:])
    _bad(
        spawn,
        tmp_path,
        "corrupt",
        ["--config", "tiny", "--workdir", tmp_path / "w", "--set", f"data={data}"],
        "corrupt",
    )
