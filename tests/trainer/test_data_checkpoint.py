"""The checkpoint's `data` item, written off the loop (trainer/data_checkpoint.py): the state is
the one at save time even when the loop moves on before the background write, the files are
byte-for-byte grain's, and a step written by grain's own handler restores with it."""

from __future__ import annotations

from pathlib import Path

import grain
import numpy as np
import orbax.checkpoint as ocp

from trainer.data_checkpoint import IteratorHandler, IteratorRestore, IteratorSave, frozen

FILE = "process_0-of-1.json"


def batches():
    """A small grain pipeline of the trainer's kind (an IterDataset iterator with prefetch)."""
    ds = grain.MapDataset.range(1000).shuffle(seed=3).batch(4)
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)))


def batches_after(n: int):
    it = batches()
    for _ in range(n):
        next(it)
    return it


def manager(path: Path, handler, asynchronous: bool = True) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=asynchronous, create=True)
    return ocp.CheckpointManager(path, options=options, item_handlers={"data": handler})


def test_the_state_is_taken_at_save_time_and_written_as_grain_writes_it(tmp_path: Path):
    it = batches()
    for _ in range(5):
        next(it)
    expected = next(batches_after(5))  # the batch a run resumed at step 5 reads first

    ours = manager(tmp_path / "ours", IteratorHandler())
    ours.save(5, args=ocp.args.Composite(data=IteratorSave(it)))
    for _ in range(7):  # the loop goes on while the write may still be in flight
        next(it)
    ours.wait_until_finished()

    theirs = manager(tmp_path / "grain", grain.checkpoint.CheckpointHandler(), asynchronous=False)
    again = batches_after(5)
    theirs.save(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(again)))
    theirs.wait_until_finished()
    written = (tmp_path / "ours" / "5" / "data" / FILE).read_bytes()
    assert written == (tmp_path / "grain" / "5" / "data" / FILE).read_bytes()

    # Restored, by this handler, from its own step and from grain's: batch 6 comes next.
    for where in ("ours", "grain"):
        fresh = batches()
        restored = manager(tmp_path / where, IteratorHandler()).restore(
            5, args=ocp.args.Composite(data=IteratorRestore(fresh))
        )["data"]
        np.testing.assert_array_equal(next(restored), expected)


def test_a_snapshot_does_not_follow_its_iterator():
    it = batches_after(3)
    snapshot = frozen(it)
    before = snapshot.get_state()
    next(it)
    assert snapshot.get_state() == before and frozen(it).get_state() != before
