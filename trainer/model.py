"""Decoder-only transformer: RMSNorm, RoPE, causal `jax.nn.dot_product_attention`, SwiGLU MLP.

Parameters are fp32 and annotated with logical axis names; `trainer.sharding` maps those names to
mesh axes, so the model itself never mentions a mesh.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from trainer.config import Config

Dtype = jnp.dtype


def _dense(features: int, axes: tuple[str, str], dtype: Dtype, std: float, name: str) -> nn.Dense:
    init = nn.with_logical_partitioning(nn.initializers.normal(std), axes)
    return nn.Dense(
        features, use_bias=False, dtype=dtype, param_dtype=jnp.float32, kernel_init=init, name=name
    )


class RMSNorm(nn.Module):
    dtype: Dtype

    @nn.compact
    def __call__(self, x):
        init = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
        scale = self.param("scale", init, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + 1e-6)
        return (y * scale).astype(self.dtype)


def rope_tables(seq: int, head_dim: int, theta: float):
    """cos and signed sin of the rotary angles, each [seq, 1, 2, head_dim/2] (the 2 axis holds
    the two halves of a head): computed once per step, shared by every layer."""
    half = head_dim // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    sin, cos = jnp.sin(angles)[:, None, None, :], jnp.cos(angles)[:, None, None, :]
    return jnp.concatenate([cos, cos], axis=2), jnp.concatenate([-sin, sin], axis=2)


def rope(x, tables):
    """Rotary position embedding over the last axis of x: [batch, seq, heads, head_dim].

    (x1, x2) -> (x1·cos - x2·sin, x2·cos + x1·sin), written as x·cos + flip(x)·sin over a
    [.., 2, half] view: a flip fuses into one elementwise loop, where split + concatenate
    would copy every activation twice more (forward and backward) on CPU."""
    cos, sin = tables
    b, t, n, h = x.shape
    halves = x.astype(jnp.float32).reshape(b, t, n, 2, h // 2)
    out = halves * cos + jnp.flip(halves, axis=3) * sin
    return out.reshape(b, t, n, h).astype(x.dtype)


def attention_implementation(cfg: Config, dtype: Dtype) -> str | None:
    """`jax.nn.dot_product_attention`'s implementation: cuDNN's fused kernel on a GPU in 16-bit
    (it never holds the [heads, T, T] scores, which for `1b` at T=2048 need more memory than an
    H100 has), XLA's everywhere else (CPU, TPU, float32)."""
    if cfg.attention != "auto":
        return cfg.attention
    on_gpu = jax.default_backend() == "gpu"
    return "cudnn" if on_gpu and jnp.dtype(dtype).itemsize == 2 else "xla"


class Block(nn.Module):
    cfg: Config
    dtype: Dtype

    @nn.compact
    def __call__(self, x, rope_sincos):
        cfg, dt = self.cfg, self.dtype
        heads, head_dim = cfg.n_heads, cfg.d_model // cfg.n_heads
        std = cfg.d_model**-0.5
        out_std = std / (2 * cfg.n_layers) ** 0.5

        h = RMSNorm(dt, name="attn_norm")(x)
        qkv = _dense(3 * cfg.d_model, ("embed", "qkv"), dt, std, "qkv")(h)
        qk, v = jnp.split(qkv.reshape(*x.shape[:2], 3 * heads, head_dim), [2 * heads], axis=2)
        q, k = jnp.split(rope(qk, rope_sincos), 2, axis=2)  # one rotation for q and k together
        attn = jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation=attention_implementation(cfg, dt)
        )
        attn = attn.reshape(*x.shape[:2], cfg.d_model)
        x = x + _dense(cfg.d_model, ("qkv", "embed"), dt, out_std, "attn_out")(attn)

        h = RMSNorm(dt, name="mlp_norm")(x)
        # One [d_model, 2·d_ff] matmul for gate and up: one larger dot, and the backward reads h
        # once instead of twice.
        gate, up = jnp.split(_dense(2 * cfg.d_ff, ("embed", "mlp"), dt, std, "wi")(h), 2, axis=-1)
        down = _dense(cfg.d_model, ("mlp", "embed"), dt, out_std, "down")
        return x + down(nn.silu(gate) * up)


class Transformer(nn.Module):
    cfg: Config
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, tokens):
        cfg = self.cfg
        init = nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed"))
        embed = nn.Embed(cfg.vocab_size, cfg.d_model, embedding_init=init, name="embed")
        x = embed(tokens).astype(self.dtype)
        tables = rope_tables(tokens.shape[1], cfg.d_model // cfg.n_heads, cfg.rope_theta)
        block = nn.remat(Block) if cfg.remat else Block
        for i in range(cfg.n_layers):
            x = block(cfg, self.dtype, name=f"block_{i}")(x, tables)
        x = RMSNorm(self.dtype, name="final_norm")(x)
        head = _dense(cfg.vocab_size, ("embed", "vocab"), self.dtype, cfg.d_model**-0.5, "head")
        return head(x).astype(jnp.float32)


def count_params(params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))


def flops_per_token(cfg: Config, n_params: int) -> float:
    """Model FLOPs per trained token: 6N for the matmuls (fwd+bwd, embedding lookup excluded)
    plus 12·L·T·d for attention scores and values (PaLM appendix B convention)."""
    matmul_params = n_params - cfg.vocab_size * cfg.d_model
    return 6.0 * matmul_params + 12.0 * cfg.n_layers * cfg.seq_len * cfg.d_model
