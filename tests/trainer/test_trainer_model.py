"""Model pieces whose fast form must equal the textbook form."""

import jax
import jax.numpy as jnp
import numpy as np

from trainer.config import PRESETS, Config
from trainer.model import Transformer, count_params, rope, rope_tables


def textbook_rope(x, theta=10000.0):
    """RoPE as usually written: split the head in halves, rotate, concatenate."""
    seq, head_dim = x.shape[1], x.shape[-1]
    half = head_dim // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def test_rope_equals_the_split_and_concatenate_form_bit_for_bit():
    x = jax.random.normal(jax.random.key(1), (2, 32, 4, 16), jnp.float32)
    fast = rope(x, rope_tables(32, 16, 10000.0))
    np.testing.assert_array_equal(np.asarray(fast), np.asarray(textbook_rope(x)))


def test_rope_scores_depend_only_on_relative_position():
    q = jnp.broadcast_to(jax.random.normal(jax.random.key(2), (16,)), (1, 8, 1, 16))
    k = jnp.broadcast_to(jax.random.normal(jax.random.key(3), (16,)), (1, 8, 1, 16))
    tables = rope_tables(8, 16, 10000.0)
    rq, rk = rope(q, tables)[0, :, 0], rope(k, tables)[0, :, 0]
    scores = np.asarray(rq @ rk.T)
    # Same offset, same score; a different offset, a different score.
    np.testing.assert_allclose(scores[5, 2], scores[3, 0], rtol=1e-5)
    np.testing.assert_allclose(scores[7, 7], scores[0, 0], rtol=1e-5)
    assert abs(scores[5, 2] - scores[5, 3]) > 1e-3


def test_small_preset_has_tens_of_millions_of_parameters():
    cfg = Config(**PRESETS["small"])
    shapes = jax.eval_shape(
        Transformer(cfg).init, jax.random.key(0), jnp.zeros((1, cfg.seq_len), jnp.int32)
    )
    assert 10e6 <= count_params(shapes["params"]) < 100e6
