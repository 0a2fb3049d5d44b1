"""A copy of a state's arrays in host memory, dispatched in one call and never awaited: what a
save costs the training loop (issue 50: saves block no longer than the device-to-host copy).
Both tiers take it: the built-in trainer's Orbax save (trainer.save_start) and the local tier
(tpupod_job.local_tier), whose writer thread awaits it.

One `jax.device_put` of every shard this process holds, each to its own device's host memory,
then the arrays put together again (`make_array_from_single_device_arrays`). Not the global
arrays' own `device_put` to host memory: with more than one process that waited for the step
computing them (measured: the call took the whole 70 ms step on the local pod's two processes,
against 3-12 ms for this one), and one call per leaf dispatched ~40 transfers for `tiny`'s
state (3.8 ms on an idle CPU, 20-40 ms inside the pod's loop). The copy is never awaited
here: it reads the step that computes the state, still running when the loop saves, and
awaiting it would hold the loop for the rest of that step. The next step donates the state the
copy reads; the runtime runs the copy first (a donation never changes an array already made
from the donated one: JAX's value semantics). `may_alias=False`: a copy even where the target
is where the array already is, so the donation cannot take it.
"""

from __future__ import annotations

import functools

import jax


@functools.cache
def _has_pinned_host(devices: frozenset) -> bool:
    """Whether these devices have `pinned_host` memory (asked once per set, not once a save)."""
    return any(m.kind == "pinned_host" for d in devices for m in d.addressable_memories())


def _host(sharding):
    """The same placement in host memory where its devices have it; else as it is (a copy
    there, which the step cannot donate)."""
    if _has_pinned_host(frozenset(sharding.device_set)):
        return sharding.with_memory_kind("pinned_host")
    return sharding


def to_host(single: list[jax.Array]) -> list[jax.Array]:
    """Copies of single-device arrays (shards' `data`), each in its device's host memory, all
    dispatched in one call; the local tier writes these as they are."""
    return jax.device_put(single, [_host(a.sharding) for a in single], may_alias=False)


def host_copy(tree):
    """`tree` with every jax.Array leaf replaced by its copy (dispatched, not awaited: whoever
    reads it awaits it, `jax.block_until_ready` or `np.asarray`); other leaves as they are."""
    leaves, treedef = jax.tree.flatten(tree)
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
    copies = iter(to_host([s.data for i in where for s in leaves[i].addressable_shards]))
    for i in where:
        leaf = leaves[i]
        mine = [next(copies) for _ in leaf.addressable_shards]
        leaves[i] = jax.make_array_from_single_device_arrays(leaf.shape, _host(leaf.sharding), mine)
    return jax.tree.unflatten(treedef, leaves)
