"""Two processes x two CPU devices (gloo) against one process x four devices, and a SIGTERM to
process 1 only: both processes stop at the same step, exit 75, and resume bitwise identical.

The same three 2-process starts carry the per-process compile cache (trainer/compile_cache.py):
the first compiles and writes one entry per process, the second loads both and trains on without
a gloo deadlock, and once process 1's entry is gone the third has every process compile (no mixed
cached and fresh programs) and writes the entry again, still resuming bitwise."""

from __future__ import annotations

import random
import signal

import pytest
from trainer_testlib import free_port, multi_args, summary

from trainer.status import read_status

STEPS = 30
NO_DEADLOCK_S = 150.0  # a deadlocked pair never exits; a healthy run takes ~20 s on 2 cores


def _pod(spawn, tmp_path, wd, name, cache, steps=STEPS):
    port = free_port()
    return [
        spawn(
            ["--config", "tiny", "--workdir", wd, "--steps", steps, "--compile-cache", cache,
             "--status-file", tmp_path / f"{name}.{i}.status", *multi_args(port, 2, i)],
            tmp_path, f"{name}.{i}", devices=2,
        )
        for i in range(2)
    ]  # fmt: skip


def _wait_all(procs, code):
    for p in procs:
        assert p.wait(timeout=NO_DEADLOCK_S) == code, p.stderr[-4000:]


def _compiled(proc) -> dict:
    return [e for e in proc.lines() if e.get("event") == "compiled"][-1]


# slow (eight trainer starts, ~2 minutes): CI runs two processes per run on the local pod, where
# every e2e job resumes bitwise; CI stays under 20 minutes on 2 cores.
@pytest.mark.slow
def test_two_processes_match_one_resume_exactly_and_share_the_compile_cache(spawn, tmp_path):
    # One process x 4 devices and the first 2-process start run side by side: independent
    # runs (own workdirs and caches), and a 2-core machine idles in each one's start-up.
    one = spawn(["--config", "tiny", "--workdir", tmp_path / "one", "--steps", STEPS],
                tmp_path, "one", devices=4)  # fmt: skip
    cache = tmp_path / "cache"
    pod = _pod(spawn, tmp_path, tmp_path / "two", "two", cache)
    assert one.wait() == 0, one.stderr
    ref_one = summary(tmp_path / "one")
    _wait_all(pod, 0)
    ref_two = summary(tmp_path / "two")
    assert ref_two["processes"] == 2 and ref_two["devices"] == 4
    # Same global batch, same program shape. The fingerprints agree only to a tolerance: gloo's
    # cross-process all-reduce adds the per-device partial sums in a different order than the
    # in-process CPU all-reduce, and fp32 addition is not associative (observed ~1e-7 relative).
    rel = abs(ref_one["params_norm"] - ref_two["params_norm"]) / ref_one["params_norm"]
    assert rel < 1e-5, (ref_one, ref_two)
    assert abs(ref_one["final_loss"] - ref_two["final_loss"]) < 1e-4
    # The first start compiled and kept one entry per process, of its step and of its init.
    assert ref_two["compile_cache_hit"] is False
    assert _compiled(pod[0])["compile_cache"].startswith("compiled")
    # (beside them, the CPU peak's dot_peak.json where this session probed: trainer.peak)
    kept = sorted(p.name for p in cache.iterdir() if p.name.endswith(".xla"))
    assert [e.split("-")[0] + "-" + e.rsplit("-", 1)[1] for e in kept] == [
        "init-p0.xla", "init-p1.xla", "train-p0.xla", "train-p1.xla"], kept  # fmt: skip
    entries = sorted((e for e in kept if e.startswith("train-step-")),
                     key=lambda name: name.rsplit("-", 1)[1])  # fmt: skip

    # Second start, on the cached programs: SIGTERM to process 1 only; both agree on the step,
    # save it, exit 75.
    wd = tmp_path / "pre"
    pod = _pod(spawn, tmp_path, wd, "pre1", cache)
    k = random.randint(2, 6)
    pod[0].wait_for(lambda: pod[0].last_step() >= k, what=f"step {k}")
    pod[1].signal(signal.SIGTERM)
    _wait_all(pod, 75)
    statuses = [read_status(tmp_path / f"pre1.{i}.status") for i in range(2)]
    assert {s.state for s in statuses} == {"preempted"}
    assert [s.compile_cache_hit for s in statuses] == [True, True]
    assert _compiled(pod[0])["cache_load_s"] > 0
    stopped = statuses[0].step
    assert statuses[1].step == stopped and statuses[0].last_checkpoint == stopped < STEPS

    # Process 1 lost its entry (a new worker disk, a failed write): nobody may use theirs alone.
    (cache / entries[1]).unlink()
    pod = _pod(spawn, tmp_path, wd, "pre2", cache)
    _wait_all(pod, 0)
    statuses = [read_status(tmp_path / f"pre2.{i}.status") for i in range(2)]
    assert [s.restored_from for s in statuses] == [stopped, stopped]
    assert [s.compile_cache_hit for s in statuses] == [False, False]
    assert "processes [1] had no usable entry" in _compiled(pod[0])["compile_cache"]
    assert sorted(p.name for p in cache.iterdir() if p.name.endswith(".xla")) == kept  # again
    assert summary(wd)["params_fingerprint"] == ref_two["params_fingerprint"]

    # A different process count cannot restore the data state: one line, exit 2.
    listing = sorted(p.name for p in (wd / "checkpoints").iterdir())
    bad = spawn(["--config", "tiny", "--workdir", wd, "--steps", STEPS + 4], tmp_path, "bad",
                devices=4)  # fmt: skip
    assert bad.wait() == 2, bad.stderr
    assert "written by 2 processes" in bad.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in (wd / "checkpoints").iterdir()) == listing
