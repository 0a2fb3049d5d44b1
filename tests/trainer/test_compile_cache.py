"""The per-process compile cache's one case that needs no 2-process run: an entry that does not
load. Its 2-process cases (the second start hits the cache without a gloo deadlock; a partial
cache has every process compile) ride on the three 2-process starts of
test_trainer_multiprocess.py, which start alike anyway."""

from __future__ import annotations


def test_an_entry_that_does_not_load_only_costs_a_compile(tmp_path):
    """A corrupt entry (a torn write, another jax version) reads as unloadable, never raises: the
    agreement then has every process compile, as the partial-cache start of
    test_trainer_multiprocess.py shows."""
    import jax
    import jax.numpy as jnp

    from trainer.compile_cache import _load

    lowered = jax.jit(lambda x: x * 2).lower(jnp.ones(3))
    entry = tmp_path / "entry-p0.xla"
    entry.write_bytes(b"not an executable")
    executable, why = _load(str(entry), lowered)
    assert executable is None and why.startswith("unloadable ("), why
    assert _load(str(tmp_path / "missing"), lowered) == (None, "no entry")
