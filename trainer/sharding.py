"""Mesh, sharding rules, sharded state creation and the jitted train step.

The state is born sharded: `eval_shape` gives its structure and logical axes, the rules turn those
into `NamedSharding`s, and a jit with `out_shardings` materialises each shard on its own device,
so no host ever holds a full copy. The same abstract state (with shardings) is what a checkpoint
restores into.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from trainer.config import BadInput, Config
from trainer.model import Transformer

DATA_AXES = ("data", "fsdp")
# Logical axis -> mesh axis. Parameters shard their embedding dimension over `fsdp`.
RULES = (
    ("batch", DATA_AXES),
    ("embed", "fsdp"),
    ("vocab", None),
    ("qkv", None),
    ("mlp", None),
)


def make_mesh(cfg: Config) -> Mesh:
    n = jax.device_count()
    data, fsdp = cfg.mesh_data, cfg.mesh_fsdp
    if data == -1 and fsdp == -1:
        raise BadInput("at most one of mesh_data, mesh_fsdp may be -1")
    if data == -1:
        data = n // fsdp if fsdp > 0 and n % fsdp == 0 else 0
    if fsdp == -1:
        fsdp = n // data if data > 0 and n % data == 0 else 0
    if data <= 0 or fsdp <= 0 or data * fsdp != n:
        raise BadInput(f"mesh data={cfg.mesh_data} x fsdp={cfg.mesh_fsdp} does not fit {n} devices")
    if cfg.batch_size % (data * fsdp):
        raise BadInput(
            f"batch_size={cfg.batch_size} is not divisible by the data axes (data*fsdp={n})"
        )
    if cfg.batch_size % jax.process_count():
        raise BadInput(f"batch_size={cfg.batch_size} not divisible by {jax.process_count()} hosts")
    devices = mesh_utils.create_device_mesh((data, fsdp), allow_split_physical_axes=True)
    return Mesh(devices, DATA_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(DATA_AXES, None))


def compute_dtype(cfg: Config):
    if cfg.compute_dtype == "auto":
        return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    return jnp.dtype(cfg.compute_dtype)


def make_optimizer(cfg: Config):
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        decay_steps=max(cfg.steps, cfg.warmup_steps + 1),
        end_value=cfg.learning_rate * cfg.min_lr_ratio,
    )
    tx = optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay),
    )
    return tx, schedule


class Setup:
    """Everything derived from (config, mesh): model, optimizer, shardings, jitted functions."""

    def __init__(self, cfg: Config, mesh: Mesh):
        self.cfg, self.mesh = cfg, mesh
        self.model = Transformer(cfg, compute_dtype(cfg))
        self.tx, self.schedule = make_optimizer(cfg)
        self.batch_sharding = batch_sharding(mesh)
        boxed = jax.eval_shape(self._init_boxed, jax.random.key_data(jax.random.key(0)))
        specs = nn.get_partition_spec(boxed)
        self.state_shardings = nn.logical_to_mesh_sharding(specs, mesh, RULES)
        self.abstract_state = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            nn.meta.unbox(boxed),
            self.state_shardings,
        )

    def _init_boxed(self, rng):
        init_rng, state_rng = jax.random.split(jax.random.wrap_key_data(rng))
        dummy = jnp.zeros((1, self.cfg.seq_len), jnp.int32)
        params = self.model.init(init_rng, dummy)["params"]
        return {
            "step": jnp.zeros((), jnp.int32),
            "params": params,
            "opt_state": self.tx.init(params),
            "rng": jax.random.key_data(state_rng),
        }

    def lower_init(self):
        """The program that creates a fresh state directly in its shardings, lowered (it depends
        on the seed's shape only, not its value): compiled or loaded by trainer.compile_cache."""
        init = jax.jit(
            lambda rng: nn.meta.unbox(self._init_boxed(rng)), out_shardings=self.state_shardings
        )
        with self.mesh:
            return init.lower(jax.random.key_data(jax.random.key(0)))

    def init_state(self, seed: int, compiled):
        """A fresh state from `compiled`, lower_init's program."""
        with self.mesh:
            return compiled(jax.random.key_data(jax.random.key(seed)))

    def _train_step(self, state, batch):
        inputs, targets = batch[:, :-1], batch[:, 1:]

        def loss_fn(params):
            logits = self.model.apply({"params": params}, inputs)
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
            return losses.mean()

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = self.tx.update(grads, state["opt_state"], state["params"])
        new_state = {
            "step": state["step"] + 1,
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
            "rng": state["rng"],
        }
        metrics = {
            "loss": loss,
            "grad_norm": optax.global_norm(grads),
            "learning_rate": self.schedule(state["step"]),
        }
        return new_state, metrics

    def lower_train_step(self):
        """Lowers the train step for the abstract state; compile() may hit the persistent cache."""
        step = jax.jit(
            self._train_step,
            in_shardings=(self.state_shardings, self.batch_sharding),
            out_shardings=(self.state_shardings, None),
            donate_argnums=(0,),
        )
        batch = jax.ShapeDtypeStruct(
            (self.cfg.batch_size, self.cfg.seq_len + 1), jnp.int32, sharding=self.batch_sharding
        )
        with self.mesh:
            return step.lower(self.abstract_state, batch)


def params_fingerprint(params) -> tuple[str, float]:
    """sha256 over every parameter leaf's bytes in tree order (gathered to every host), and the
    global L2 norm in float64 (for comparisons that hold only to a tolerance)."""
    import hashlib

    from jax.experimental import multihost_utils

    digest, sq = hashlib.sha256(), 0.0
    for leaf in jax.tree.leaves(params):
        full = np.ascontiguousarray(np.asarray(multihost_utils.process_allgather(leaf, tiled=True)))
        digest.update(full.tobytes())
        sq += float(np.sum(np.square(full.astype(np.float64))))
    return digest.hexdigest(), sq**0.5
