"""Two processes x two CPU devices (gloo) against one process x four devices, and a SIGTERM to
process 1 only: both processes stop at the same step, exit 75, and resume bitwise identical."""

from __future__ import annotations

import random
import signal

from trainer_testlib import free_port, multi_args, summary

from trainer.status import read_status

STEPS = 30


def _pod(spawn, tmp_path, wd, name, steps=STEPS):
    port = free_port()
    return [
        spawn(
            ["--config", "tiny", "--workdir", wd, "--steps", steps,
             "--status-file", tmp_path / f"{name}.{i}.status", *multi_args(port, 2, i)],
            tmp_path, f"{name}.{i}", devices=2,
        )
        for i in range(2)
    ]  # fmt: skip


def _wait_all(procs, code):
    for p in procs:
        assert p.wait() == code, p.stderr[-4000:]


def test_two_processes_match_one_and_resume_exactly(spawn, tmp_path):
    one = spawn(["--config", "tiny", "--workdir", tmp_path / "one", "--steps", STEPS],
                tmp_path, "one", devices=4)  # fmt: skip
    assert one.wait() == 0, one.stderr
    ref_one = summary(tmp_path / "one")

    pod = _pod(spawn, tmp_path, tmp_path / "two", "two")
    _wait_all(pod, 0)
    ref_two = summary(tmp_path / "two")
    assert ref_two["processes"] == 2 and ref_two["devices"] == 4
    # Same global batch, same program shape. The fingerprints agree only to a tolerance: gloo's
    # cross-process all-reduce adds the per-device partial sums in a different order than the
    # in-process CPU all-reduce, and fp32 addition is not associative (observed ~1e-7 relative).
    rel = abs(ref_one["params_norm"] - ref_two["params_norm"]) / ref_one["params_norm"]
    assert rel < 1e-5, (ref_one, ref_two)
    assert abs(ref_one["final_loss"] - ref_two["final_loss"]) < 1e-4

    # SIGTERM to process 1 only: both agree on the step, save it, exit 75.
    wd = tmp_path / "pre"
    pod = _pod(spawn, tmp_path, wd, "pre1")
    k = random.randint(2, 6)
    pod[0].wait_for(lambda: pod[0].last_step() >= k, what=f"step {k}")
    pod[1].signal(signal.SIGTERM)
    _wait_all(pod, 75)
    statuses = [read_status(tmp_path / f"pre1.{i}.status") for i in range(2)]
    assert {s.state for s in statuses} == {"preempted"}
    stopped = statuses[0].step
    assert statuses[1].step == stopped and statuses[0].last_checkpoint == stopped < STEPS

    pod = _pod(spawn, tmp_path, wd, "pre2")
    _wait_all(pod, 0)
    statuses = [read_status(tmp_path / f"pre2.{i}.status") for i in range(2)]
    assert [s.restored_from for s in statuses] == [stopped, stopped]
    assert summary(wd)["params_fingerprint"] == ref_two["params_fingerprint"]

    # A different process count cannot restore the data state: one line, exit 2.
    listing = sorted(p.name for p in (wd / "checkpoints").iterdir())
    bad = spawn(["--config", "tiny", "--workdir", wd, "--steps", STEPS + 4], tmp_path, "bad",
                devices=4)  # fmt: skip
    assert bad.wait() == 2, bad.stderr
    assert "written by 2 processes" in bad.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in (wd / "checkpoints").iterdir()) == listing
