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
    """sin and cos of the rotary angles, [1, seq, 1, head_dim/2]: computed once per step, shared
    by every layer."""
    half = head_dim // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    return jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]


def rope(x, tables):
    """Rotary position embedding over the last axis of x: [batch, seq, heads, head_dim]."""
    sin, cos = tables
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


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
        q, k, v = jnp.split(qkv.reshape(*x.shape[:2], 3 * heads, head_dim), 3, axis=2)
        q, k = rope(q, rope_sincos), rope(k, rope_sincos)
        attn = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        attn = attn.reshape(*x.shape[:2], cfg.d_model)
        x = x + _dense(cfg.d_model, ("qkv", "embed"), dt, out_std, "attn_out")(attn)

        h = RMSNorm(dt, name="mlp_norm")(x)
        gate = _dense(cfg.d_ff, ("embed", "mlp"), dt, std, "gate")(h)
        up = _dense(cfg.d_ff, ("embed", "mlp"), dt, std, "up")(h)
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
        for i in range(cfg.n_layers):
            x = Block(cfg, self.dtype, name=f"block_{i}")(x, tables)
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
