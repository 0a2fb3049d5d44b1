"""A state's shape, leaf by leaf, and what differs between two: how a checkpoint written for
another model (other leaves, other shapes) is refused in one line before Orbax reads it. A
checkpoint carries its state's leaf shapes in its small `meta` item (with_leaves), so a resume
compares them without opening every array's metadata in the bucket."""

from __future__ import annotations

import jax


def leaf_shapes(tree) -> dict[str, tuple[int, ...]]:
    """Leaf path ("params/block_0/wi/kernel") -> shape, for a state or Orbax's metadata of one."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
        for path, leaf in leaves
    }


def tree_difference(stored: dict, expected: dict, show: int = 2) -> str:
    """What differs, briefly: leaves only the checkpoint has, leaves it lacks, other shapes."""

    def some(keys, describe) -> str:
        keys = sorted(keys, key=lambda k: (not k.startswith("params/"), k))  # params first
        more = f" and {len(keys) - show} more" if len(keys) > show else ""
        return ", ".join(describe(k) for k in keys[:show]) + more

    parts = []
    if extra := stored.keys() - expected.keys():
        parts.append(f"has {some(extra, str)} that this model lacks")
    if missing := expected.keys() - stored.keys():
        parts.append(f"lacks {some(missing, str)}")
    if reshaped := {k for k in stored.keys() & expected.keys() if stored[k] != expected[k]}:
        parts.append(
            "has " + some(reshaped, lambda k: f"{k} {list(stored[k])} (model: {list(expected[k])})")
        )
    return "; ".join(parts)


def with_leaves(meta: dict, state) -> dict:
    """`meta` (a checkpoint's JSON item) with `state`'s leaf shapes."""
    return {**meta, "leaves": {path: list(shape) for path, shape in leaf_shapes(state).items()}}


def leaves_in(meta: dict) -> dict[str, tuple[int, ...]] | None:
    """The leaf shapes `with_leaves` stored; None for a checkpoint written before it did (its
    arrays' own metadata has them: Orbax's item_metadata)."""
    leaves = meta.get("leaves")
    return None if leaves is None else {path: tuple(shape) for path, shape in leaves.items()}
