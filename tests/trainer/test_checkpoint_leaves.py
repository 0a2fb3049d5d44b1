"""A resume checks the checkpoint's leaf shapes from its small `meta` item (trainer.tree_shapes
with_leaves), opening no array; a checkpoint written before meta carried them is checked from
Orbax's metadata of its arrays, as before. Both refuse another tree in the same one line."""

from __future__ import annotations

import dataclasses
import json

import grain
import jax
import jax.numpy as jnp
import pytest

from trainer import checkpoint
from trainer.config import BadInput, load_config

DIFFERENCE = r"has b that this model lacks; lacks c; has w \[8\] \(model: \[9\]\)"


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _saved(tmp_path, state) -> checkpoint.Checkpoints:
    ds = grain.MapDataset.range(100).batch(4)
    data = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)))
    cfg = dataclasses.replace(load_config("tiny"), checkpoint_async=False)
    checkpoints = checkpoint.Checkpoints(str(tmp_path / "run"), cfg, 1)
    checkpoints.save(10, state, data)
    assert checkpoints.wait() == 10
    return checkpoints


def test_leaf_shapes_come_from_the_meta_and_from_orbax_for_older_checkpoints(tmp_path,
                                                                             monkeypatch):  # fmt: skip
    state = {"w": jnp.arange(8.0), "b": jnp.zeros((2, 3)), "step": jnp.int32(10)}
    other = {"w": jnp.arange(9.0), "c": jnp.zeros((2, 3)), "step": jnp.int32(10)}
    checkpoints = _saved(tmp_path, state)
    try:
        meta_file = tmp_path / "run" / "checkpoints" / "10" / "meta" / "metadata"
        meta = json.loads(meta_file.read_text())
        assert meta["leaves"] == {"b": [2, 3], "step": [], "w": [8]}

        def opened(step):
            raise AssertionError("item_metadata opened the arrays: the meta has their shapes")

        with monkeypatch.context() as patch:
            patch.setattr(checkpoints.manager, "item_metadata", opened)
            checkpoints.check_compatible(10, _abstract(state))
            with pytest.raises(BadInput, match=DIFFERENCE):
                checkpoints.check_compatible(10, _abstract(other))

        # Written before meta carried the shapes: Orbax's metadata of the arrays says them.
        monkeypatch.setattr(checkpoint, "leaves_in", lambda meta: None)
        checkpoints.check_compatible(10, _abstract(state))
        with pytest.raises(BadInput, match=DIFFERENCE):
            checkpoints.check_compatible(10, _abstract(other))
    finally:
        checkpoints.close()
