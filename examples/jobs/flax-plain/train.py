"""A plain Flax + Optax + Orbax training program, as a user brings it: no tpupod import.

It reads the job contract's environment (README, "Bring your own program"), trains a small MLP
on synthetic data made from the step number (so a resumed run sees the same batches), saves with
Orbax every `--save-every` steps and at the step every process agrees on after a preemption
notice, and, like MaxText and Orbax's own guide, exits 0 when preempted: tpupod knows from the
SIGTERM that this is not done. It prints `step N loss L`, the progress tpupod reads.

`--resume-from-latest` resumes at the latest saved step instead of the one after it, as the loop
in Orbax's guide does: the saved step is trained twice, so the weights differ from a run that
was never interrupted (examples/jobs/wrong-resume: the comparison's negative control).
"""

from __future__ import annotations

import argparse
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


class Mlp(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x):
        x = nn.gelu(nn.Dense(self.width)(x))
        x = nn.gelu(nn.Dense(self.width)(x))
        return nn.Dense(1)(x)


def batch_for(step: int, size: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of `step`, the same on every process and after any restart."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((size, features), dtype=np.float32)
    y = np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32)
    return x, y


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--resume-from-latest", action="store_true")
    args = parser.parse_args()

    # 1. Every process of the slice: the contract passes the coordinator, count and id.
    processes = int(os.environ.get("TPUPOD_NUM_PROCESSES", "1"))
    stop_requested = []
    if processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU only; no-op on TPU
        jax.distributed.initialize(
            coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
            num_processes=processes,
            process_id=int(os.environ["TPUPOD_PROCESS_ID"]),
        )
    else:  # one process has no preemption notifier: note the SIGTERM ourselves
        signal.signal(signal.SIGTERM, lambda *_: stop_requested.append(True))
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, by_row = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    # 2. Model, optimizer, and the state's shape for restoring.
    model, optimizer = Mlp(args.width), optax.adamw(1e-3)
    features = 16

    def init():
        params = model.init(jax.random.key(0), jnp.zeros((1, features)))["params"]
        return {"params": params, "opt": optimizer.init(params)}

    state_shape = jax.eval_shape(init)
    shardings = jax.tree.map(lambda _: replicated, state_shape)

    @jax.jit
    def train_step(state, x, y):
        def loss_fn(params):
            return jnp.mean((model.apply({"params": params}, x) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt = optimizer.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

    # 3. Resume from the latest committed checkpoint, or start fresh.
    options = ocp.CheckpointManagerOptions(save_interval_steps=args.save_every, max_to_keep=3)
    manager = ocp.CheckpointManager(os.environ["TPUPOD_CHECKPOINT_DIR"], options=options)
    latest = manager.latest_step()
    if latest is None:
        state, first = jax.jit(init, out_shardings=shardings)(), 1
    else:
        target = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            state_shape,
            shardings,
        )
        state = manager.restore(latest, args=ocp.args.StandardRestore(target))
        first = latest if args.resume_from_latest else latest + 1
        print(f"restored step {latest}", flush=True)

    # 4. Train; save on the interval and at the agreed preemption step (Orbax's default policy
    # includes it), and exit 0 once that save is committed.
    saved = latest
    for step in range(first, args.steps + 1):
        x, y = batch_for(step, args.batch, features)
        x = jax.make_array_from_callback(x.shape, by_row, lambda index, a=x: a[index])
        y = jax.make_array_from_callback(y.shape, by_row, lambda index, a=y: a[index])
        state, loss = train_step(state, x, y)
        if manager.save(step, args=ocp.args.StandardSave(state)):
            saved = step
        print(f"step {step} loss {float(loss):.6f}", flush=True)
        if stop_requested or (processes > 1 and saved == step and manager.reached_preemption(step)):
            if saved != step:
                manager.save(step, args=ocp.args.StandardSave(state), force=True)
            manager.wait_until_finished()
            print(f"preempted at step {step}: checkpoint committed", flush=True)
            return 0
    if saved != args.steps:
        manager.save(args.steps, args=ocp.args.StandardSave(state), force=True)
    manager.wait_until_finished()
    print(f"done at step {args.steps}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
