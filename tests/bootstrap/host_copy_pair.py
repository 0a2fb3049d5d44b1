"""One of two processes (jax.distributed over localhost, two CPU devices each) for
test_host_copy: how long `host_copy` holds the caller while a step computing the state runs,
against the same state's global `device_put` to host memory (the control, which waits for the
step). Prints one JSON line: medians in ms."""

from __future__ import annotations

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from tpupod_job.host_copy import host_copy


def main(process_id: int, port: str) -> None:
    jax.distributed.initialize(f"127.0.0.1:{port}", 2, process_id, initialization_timeout=60)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("d",))
    replicated, split = (
        NamedSharding(mesh, PartitionSpec()),
        NamedSharding(mesh, PartitionSpec("d")),
    )
    state = {f"w{i}": jax.device_put(jnp.full((64, 192), i / 7.0), replicated) for i in range(20)}
    state["rows"] = jax.device_put(jnp.arange(64 * 192, dtype=jnp.float32).reshape(64, 192), split)
    step = jax.jit(lambda t: jax.tree.map(
        lambda x: jax.lax.fori_loop(0, 400, lambda i, w: jnp.tanh(w * 1.0001), x), t))  # fmt: skip
    pinned = {k: v.sharding.with_memory_kind("pinned_host") for k, v in state.items()}
    ways = {"host_copy": host_copy, "global_device_put": lambda t: jax.device_put(t, pinned)}
    state = jax.block_until_ready(step(state))
    out = {}
    for name, copy in ways.items():
        jax.block_until_ready(copy(state))  # warm
        calls, steps = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            state = step(state)  # in flight
            t1 = time.perf_counter()
            copied = copy(state)
            t2 = time.perf_counter()
            jax.block_until_ready(copied)
            steps.append(time.perf_counter() - t0)
            calls.append(t2 - t1)
            for k in state:  # the copy holds this process's shards of the step's values
                for mine, theirs in zip(copied[k].addressable_shards, state[k].addressable_shards,
                                        strict=True):  # fmt: skip
                    assert np.array_equal(np.asarray(mine.data), np.asarray(theirs.data))
        out[name] = {"call_ms": 1000 * statistics.median(calls),
                     "step_ms": 1000 * statistics.median(steps)}  # fmt: skip
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
