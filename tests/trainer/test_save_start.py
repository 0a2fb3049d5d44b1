"""A periodic save costs the loop the state's copy to host memory only (trainer/save_start.py;
the copy itself: tests/bootstrap/test_host_copy.py): Orbax's save of that copy starts on a
thread while the loop goes on and donates the state it saved; the step still restores bitwise
equal. A start that fails raises on the loop's thread, and Orbax never asks JAX about the
preemption sync point."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer import save_start


def _donating_step():
    return jax.jit(lambda s: jax.tree.map(lambda x: x * 3 + 1, s), donate_argnums=0)


def test_a_failed_start_raises_on_the_loop_thread():
    starter, ran = save_start.SaveStarter(), threading.Event()

    def fails():
        ran.set()
        raise OSError("bucket unreachable")

    starter.start(fails)
    with pytest.raises(OSError, match="bucket unreachable"):
        starter.join()
    assert ran.is_set()
    starter.check()  # raised once, not again
    assert not starter.busy()


def test_the_manager_never_asks_about_the_preemption_sync_point(tmp_path, monkeypatch):
    """tpupod_job.should_stop asks, on the loop; Orbax asking about an older step from its
    threads would move the process's step back in JAX's sync manager."""
    import orbax.checkpoint as ocp
    from orbax.checkpoint import checkpoint_manager

    asked: list[int] = []
    monkeypatch.setattr(checkpoint_manager.utils, "reached_preemption",
                        lambda step: asked.append(step) or False)  # fmt: skip
    plain = ocp.CheckpointManager(str(tmp_path / "plain"))
    plain.reached_preemption(4)
    assert asked == [4]  # negative control: Orbax's own manager asks JAX
    plain.close()
    quiet = save_start.orbax_manager(str(tmp_path / "quiet"), ocp.CheckpointManagerOptions(), 1)
    quiet.reached_preemption(5)
    other = threading.Thread(target=quiet.reached_preemption, args=(3,), name="finalize")
    other.start()
    other.join()
    assert asked == [4]
    quiet.close()


@pytest.mark.parametrize("where", ["local", "gs"])
def test_a_save_started_off_the_loop_restores_bitwise(where, tmp_path, request):
    """The loop saves step 10 periodically, then its next step donates the state while Orbax's
    save of the copy may still be starting: step 10 commits, with its manifest, and restores
    equal to the state as it was at the save."""
    import grain

    from trainer import checkpoint, manifest
    from trainer.config import load_config

    if where == "gs":
        request.getfixturevalue("gcs_emulator")
        workdir = "gs://tpupod-test/runs/save-start"
    else:
        workdir = str(tmp_path / "run")
    ds = grain.MapDataset.range(100).batch(4)
    data = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)))
    next(data)
    checkpoints = checkpoint.Checkpoints(workdir, load_config("tiny"), 1)
    state = {"w": jnp.arange(4096, dtype=jnp.float32) / 7, "step": jnp.int32(10)}
    expected = jax.tree.map(np.array, state)  # copies: a view would keep the buffer
    step = _donating_step()
    step(jax.tree.map(jnp.copy, state))  # compiled now, so that it donates right after the save
    checkpoints.save(10, state, data, periodic=True)
    state = step(state)  # the loop goes on at once
    next(data)
    assert checkpoints.wait() == 10
    assert manifest.check(checkpoints.step_dir(10), run_has_manifests=True) is None
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            state)  # fmt: skip
    fresh = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)))
    restored, restored_data = checkpoints.restore(10, abstract, fresh)
    for key, value in expected.items():
        assert np.array_equal(np.asarray(restored[key]), value)
    assert np.array_equal(next(restored_data), np.arange(4, 8))  # the iterator as at the save
    checkpoints.close()


def _checkpoints(workdir: str, **changes):
    import dataclasses

    import grain

    from trainer import checkpoint
    from trainer.config import load_config

    ds = grain.MapDataset.range(100).batch(4)
    data = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)))
    cfg = dataclasses.replace(load_config("tiny"), **changes)
    return checkpoint.Checkpoints(workdir, cfg, 1), data


def test_a_save_whose_commit_failed_is_never_reported_committed(tmp_path, monkeypatch):
    """Orbax clears its in-progress flag after a failed finalize too: the flag alone would
    report the failed step as committed; poll raises the save's error instead."""
    from trainer import checkpoint

    checkpoints, data = _checkpoints(str(tmp_path / "run"), checkpoint_every=10)

    def fails(path, step):
        raise OSError(f"manifest of step {step}: bucket unreachable")

    monkeypatch.setattr(checkpoint.manifest, "write", fails)
    checkpoints.save(10, {"w": jnp.arange(8.0)}, data, periodic=True)
    checkpoints._starter.join()
    deadline = __import__("time").monotonic() + 30
    while checkpoints.manager.is_saving_in_progress():
        assert __import__("time").monotonic() < deadline
        threading.Event().wait(0.05)
    # negative control: by Orbax's flag alone, step 10 looks done (the old poll committed it)
    assert checkpoints._pending == 10 and not checkpoints.manager.is_saving_in_progress()
    with pytest.raises(OSError, match="manifest of step 10"):
        checkpoints.poll()
    assert checkpoints.committed is None
    assert 10 not in checkpoints.manager.all_steps()


def test_a_time_based_save_is_not_due_again_while_it_starts(tmp_path):
    """The time-based policy learns of a save when the loop hands it to the starter, not when
    Orbax lists it: the next step is not due again (no second save, nothing deferred)."""
    checkpoints, data = _checkpoints(str(tmp_path / "run"), checkpoint_every=0,
                                     checkpoint_every_seconds=3600)  # fmt: skip
    policy = checkpoints._time_policy
    assert policy is not None and policy.last_start is None
    assert checkpoints.should_save(1)  # no save yet: due
    checkpoints.save(1, {"w": jnp.arange(8.0)}, data, periodic=True)
    assert policy.last_start is not None
    assert not checkpoints.should_save(2) and checkpoints.deferred == 0
    assert checkpoints.wait() == 1
    assert not checkpoints.should_save(3) and checkpoints.deferred == 0
    # negative control: a policy that never heard of the start finds step 2 due at once
    import datetime
    from types import SimpleNamespace

    now = datetime.datetime.now(tz=datetime.UTC)
    quiet = SimpleNamespace(is_saving_in_progress=False)
    assert not policy._due(SimpleNamespace(step=2, time=now), [], quiet)
    policy.last_start = None
    assert policy._due(SimpleNamespace(step=2, time=now), [], quiet)
    checkpoints.close()


def test_a_failed_periodic_save_does_not_stop_the_final_one(tmp_path, monkeypatch, capsys):
    """A preemption's or the final save comes after a periodic one that failed: it is still
    taken, commits with its own manifest, and the failure is reported, not raised."""
    from trainer import checkpoint, manifest

    checkpoints, data = _checkpoints(str(tmp_path / "run"), checkpoint_every=10)
    write = manifest.write

    def fails_at_10(path, step):
        if step == 10:
            raise OSError("manifest of step 10: bucket unreachable")
        write(path, step)

    monkeypatch.setattr(checkpoint.manifest, "write", fails_at_10)
    checkpoints.save(10, {"w": jnp.arange(8.0)}, data, periodic=True)
    checkpoints.save(20, {"w": jnp.arange(8.0) + 1}, data)  # the final save
    assert checkpoints.wait() == 20
    assert "an earlier checkpoint save failed" in capsys.readouterr().err
    assert checkpoints.manager.all_steps() == [20]
    assert manifest.check(checkpoints.step_dir(20), run_has_manifests=True) is None
    checkpoints.close()
    # negative control: a periodic save after the failed one raises it (the run stops)
    again, data = _checkpoints(str(tmp_path / "again"), checkpoint_every=10)
    again.save(10, {"w": jnp.arange(8.0)}, data, periodic=True)
    with pytest.raises(OSError, match="manifest of step 10"):
        again.save(20, {"w": jnp.arange(8.0)}, data, periodic=True)
        again.wait()
