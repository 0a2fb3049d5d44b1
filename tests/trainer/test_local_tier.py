"""The local tier (tpupod_job.local_tier) through real trainer processes: a restart on the same
VM restores each process's own copy, not the bucket's; an empty local disk (a recreated VM) and
a damaged copy fall back to the persistent tier; every run ends bitwise equal to one never
interrupted. The persistent tier saves every 8 steps, the local one every 2; every run shares
one compile cache (the restarts' cost is the point, not the compile's).

A crash is a SIGKILL; a hang is a process stopped mid-run (SIGSTOP) and then killed, as the
watcher ends a hung job before restarting it (the watcher's side: tests/e2e/test_demo.py).
"""

from __future__ import annotations

import shutil
import signal

import pytest
from trainer_testlib import free_port, multi_args, run_ok, summary

from trainer.status import read_status

STEPS = 24  # room after the stop at 11 or 13, on a loaded machine too
BASE = ["--config", "tiny", "--steps", STEPS, "--set", "checkpoint_every=8",
        "--set", "local_checkpoint_every=2"]  # fmt: skip


def restored(trainer) -> dict:
    return next(r for r in trainer.lines() if r.get("event") == "restored")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One compile cache for every run here: the step is compiled once (tiny, 2 devices)."""
    return tmp_path_factory.mktemp("compile-cache")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache):
    """The uninterrupted run, with no local tier at all."""
    from trainer_testlib import Trainer, trainer_env  # spawn is per test; this is per module

    root = tmp_path_factory.mktemp("ref")
    args = [*map(str, BASE), "--workdir", str(root / "wd"), "--compile-cache", str(cache)]
    t = Trainer(args, root, "ref", trainer_env(2))
    assert t.wait() == 0, t.stderr[-3000:]
    return summary(root / "wd")["params_fingerprint"]


def interrupted(spawn, tmp_path, cache, stop_at: int, hang: bool = False):
    """A run stopped dead after `stop_at` (killed, or stopped then killed): its workdir and
    local directory as the restart finds them."""
    wd, local = tmp_path / "wd", tmp_path / "local"
    t = spawn([*BASE, "--workdir", wd, "--local-checkpoint-dir", local, "--compile-cache", cache],
              tmp_path, "first", 2)  # fmt: skip
    t.wait_for(lambda: t.last_step() >= stop_at, what=f"step {stop_at}")
    # Both tiers' copies written whole before the stop: the bucket's step 8, the local 10 or 12.
    local_step = stop_at - 1 if stop_at % 2 else stop_at

    def written() -> bool:
        held = [int(p.name) for p in local.glob("*") if p.name.isdigit()]
        return (wd / "checkpoints" / "8").is_dir() and max(held, default=0) >= local_step

    t.wait_for(written, what="step 8 committed and the local copy written")
    if hang:
        t.signal(signal.SIGSTOP)  # hung: no step, no beat
    t.kill()
    return wd, local


def restart(spawn, tmp_path, cache, wd, local, name: str) -> dict:
    """The restart on the same VM; its `restored` event (the tier and the step)."""
    again = run_ok(spawn, [*BASE, "--workdir", wd, "--local-checkpoint-dir", local,
                           "--compile-cache", cache, "--status-file", tmp_path / f"{name}.status"],
                   tmp_path, name, 2)  # fmt: skip
    return restored(again)


def test_a_crash_restores_its_own_copy_and_an_empty_or_damaged_one_the_bucket(
    spawn, tmp_path, cache, reference
):
    """One crash, three restarts: on the same disk (the local tier), on an empty disk (a
    recreated VM: the bucket) and with every local copy damaged (one byte flipped: the bucket)."""
    wd, local = interrupted(spawn, tmp_path, cache, 13)
    variants = {}
    for name in ("empty", "damaged"):
        variants[name] = (tmp_path / f"{name}-wd", tmp_path / f"{name}-local")
        shutil.copytree(wd, variants[name][0])
    variants["damaged"][1].parent.mkdir(exist_ok=True)
    shutil.copytree(local, variants["damaged"][1])
    for arrays in variants["damaged"][1].glob("*/arrays.bin"):
        data = bytearray(arrays.read_bytes())
        data[len(data) // 2] ^= 0xFF
        arrays.write_bytes(bytes(data))

    found = restart(spawn, tmp_path, cache, wd, local, "again")
    assert found["tier"] == "local" and found["step"] >= 12, found
    assert found["step"] > (found["persistent"] or 0)  # newer than the bucket's: fewer lost
    assert summary(wd)["params_fingerprint"] == reference
    for name, (v_wd, v_local) in variants.items():
        found = restart(spawn, tmp_path, cache, v_wd, v_local, name)
        assert (found["tier"], found["step"]) == ("persistent", 8), (name, found)
        assert summary(v_wd)["params_fingerprint"] == reference, name


def test_a_hang_restores_its_own_copy(spawn, tmp_path, cache, reference):
    wd, local = interrupted(spawn, tmp_path, cache, 11, hang=True)
    found = restart(spawn, tmp_path, cache, wd, local, "again")
    assert found["tier"] == "local" and found["step"] >= 10, found
    assert found["step"] > (found["persistent"] or 0)
    assert summary(wd)["params_fingerprint"] == reference
    # The status names the newest local step it wrote: newer than the one it restored, which
    # tells the watcher the restart made progress (it ends a crash loop's streak).
    # (A loaded machine may let the first run reach its end before the stop: nothing to check.)
    status = read_status(tmp_path / "again.status")
    if found["step"] <= STEPS - 4:
        assert status.local_checkpoint is not None and status.local_checkpoint > found["step"]
        assert status.local_save_s is not None and status.local_save_s > 0  # the loop's time


@pytest.mark.slow  # two processes: the steps every process holds are agreed on (allgather)
def test_two_processes_agree_on_a_step_both_hold(spawn, tmp_path, reference):
    port, wd, local = free_port(), tmp_path / "wd", tmp_path / "local"

    def start(name, i):
        args = [*BASE, "--workdir", wd, "--local-checkpoint-dir", local / str(i),
                *multi_args(port, 2, i)]  # fmt: skip
        return spawn(args, tmp_path, f"{name}{i}", 1)

    first = [start("first", i) for i in range(2)]
    first[0].wait_for(lambda: first[0].last_step() >= 11, what="step 11")
    for t in first:
        t.kill()
    newest = max(int(p.name) for p in (local / "1").iterdir() if p.name.isdigit())
    shutil.rmtree(local / "1" / str(newest))  # process 1 lacks the newest: the one before
    port = free_port()
    again = [start("again", i) for i in range(2)]
    assert [t.wait() for t in again] == [0, 0], again[1].stderr[-3000:]
    found = restored(again[0])
    assert found["tier"] == "local" and found["step"] == newest - 2, found
    assert summary(wd)["params_fingerprint"] == reference


def test_a_disk_that_refuses_costs_the_local_copy_only(tmp_path, capsys):
    """No directory can be made: no tier, one warning. A write that fails: one warning, nothing
    half written left, and the next save is tried again."""
    import jax.numpy as jnp
    from tpupod_job.local_tier import LocalTier

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert LocalTier.open(str(blocked / "local"), 2, {}) is None
    assert "warning: no local checkpoints" in capsys.readouterr().err
    tier = LocalTier.open(str(tmp_path / "local"), 2, {})
    shutil.rmtree(tmp_path / "local")
    (tmp_path / "local").write_text("")  # the directory is gone, a file in its place
    assert tier.save(4, {"w": jnp.zeros(3, jnp.float32)}, b"{}")
    tier.wait()
    assert "warning: local checkpoint step 4 not written" in capsys.readouterr().err
    assert tier.saved is None
    (tmp_path / "local").unlink()
    (tmp_path / "local").mkdir()
    assert tier.save(6, {"w": jnp.ones(3, jnp.float32)}, b"{}")
    tier.wait()
    assert tier.saved == 6 and tier.steps() == [6] and tier.verified(6) is not None


def test_the_status_counts_the_loops_time_in_local_saves(spawn, tmp_path, cache, reference):
    """The local tier's saves keep the state `training`: the status carries the loop's time in
    them (`local_save_s`, what the goodput breakdown counts as checkpoint save: bench.badput)."""
    wd = tmp_path / "wd"
    run_ok(spawn, [*BASE, "--workdir", wd, "--local-checkpoint-dir", tmp_path / "local",
                   "--compile-cache", cache, "--status-file", tmp_path / "run.status"],
           tmp_path, "run", 2)  # fmt: skip
    status = read_status(tmp_path / "run.status")
    assert status.state == "done" and status.local_checkpoint is not None
    assert 0 < status.local_save_s < summary(wd)["train_loop_s"], status
    assert summary(wd)["params_fingerprint"] == reference
