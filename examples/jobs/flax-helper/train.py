"""The same kind of program as flax-plain, written with tpupod's optional helper (`tpupod_job`,
importable on every worker): it sets up jax.distributed, the Orbax manager with its preemption
policy, the local tier (a copy every 2 steps on the worker's own disk, which a restart on the
same VMs resumes from), the status file tpupod judges progress by, and the preemption exit."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import tpupod_job
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


class Model(nn.Module):
    """A small residual MLP on synthetic regression data."""

    width: int

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(self.width)(x)
        h = h + nn.Dense(self.width)(nn.relu(h))
        return nn.Dense(1)(nn.relu(h))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()

    tpupod_job.init()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, by_row = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    model, optimizer, dim = Model(256), optax.adam(3e-3), 8

    def fresh():
        params = model.init(jax.random.key(1), jnp.zeros((1, dim)))["params"]
        return {"params": params, "opt": optimizer.init(params)}

    @jax.jit
    def train_step(state, x, y):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean((model.apply({"params": p}, x) - y) ** 2)
        )(state["params"])
        updates, opt = optimizer.update(grads, state["opt"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

    manager = tpupod_job.checkpoint_manager(save_interval_steps=args.save_every)
    abstract = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), jax.eval_shape(fresh)
    )
    tier = tpupod_job.open_local_tier(every=2, model="flax-helper")  # None outside tpupod
    latest = manager.latest_step()
    local = tier.agreed_step(latest) if tier else None  # on every process
    found = tier.restore(local, abstract) if local is not None else None
    if found is not None:
        (state, _), latest = found, local
    elif latest is None:
        state = jax.jit(fresh, out_shardings=jax.tree.map(lambda a: a.sharding, abstract))()
    else:
        state = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
    for step in range((latest or 0) + 1, args.steps + 1):
        rng = np.random.default_rng(10_000 + step)  # the batch of this step, wherever it runs
        x = rng.uniform(-1, 1, (64, dim)).astype(np.float32)
        y = np.prod(x[:, :2], axis=1, keepdims=True)
        state, loss = train_step(
            state,
            *(jax.make_array_from_callback(a.shape, by_row, lambda i, a=a: a[i]) for a in (x, y)),
        )
        manager.save(step, args=ocp.args.StandardSave(state), force=step == args.steps)
        if tier and tier.due(step):
            tier.save(step, state)
        tpupod_job.progress(step, loss=float(loss))
        if tpupod_job.should_stop(step):
            tpupod_job.exit_preempted(manager)
    manager.wait_until_finished()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
