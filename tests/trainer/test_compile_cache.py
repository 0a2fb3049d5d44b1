"""The per-process compile cache on a 2-process gloo run: the second start loads every process's
entry and trains bitwise the same; when one process's entry is gone, all of them compile (no
mixed cached/fresh programs, no gloo deadlock) and the entry comes back; an entry that does not
load costs a compile, nothing else."""

from __future__ import annotations

from trainer_testlib import free_port, multi_args, summary

STEPS = 4
NO_DEADLOCK_S = 150.0  # a deadlocked pair never exits; a healthy start takes ~20 s on 2 cores


def _start(spawn, tmp_path, name, cache):
    port = free_port()
    procs = [
        spawn(
            ["--config", "tiny", "--workdir", tmp_path / name, "--steps", STEPS,
             "--compile-cache", cache, "--status-file", tmp_path / f"{name}.{i}.status",
             *multi_args(port, 2, i)],
            tmp_path, f"{name}.{i}", devices=2,
        )
        for i in range(2)
    ]  # fmt: skip
    for p in procs:
        assert p.wait(timeout=NO_DEADLOCK_S) == 0, p.stderr[-4000:]
    compiled = [e for e in procs[0].lines() if e.get("event") == "compiled"]
    return summary(tmp_path / name), compiled[-1]


def test_second_start_hits_the_cache_and_a_partial_cache_compiles_everywhere(spawn, tmp_path):
    cache = tmp_path / "cache"
    first, ev = _start(spawn, tmp_path, "first", cache)
    assert first["compile_cache_hit"] is False and ev["compile_cache"].startswith("compiled")
    entries = sorted((p.name for p in cache.iterdir()), key=lambda name: name.rsplit("-", 1)[1])
    assert [e.rsplit("-", 1)[1] for e in entries] == ["p0.xla", "p1.xla"], entries

    second, ev = _start(spawn, tmp_path, "second", cache)
    assert second["compile_cache_hit"] is True, ev
    assert ev["cache_load_s"] > 0
    assert second["params_fingerprint"] == first["params_fingerprint"]

    # Process 1 lost its entry (a new worker disk, a failed write): nobody may use theirs alone.
    (cache / entries[1]).unlink()
    third, ev = _start(spawn, tmp_path, "third", cache)
    assert third["compile_cache_hit"] is False
    assert "processes [1] had no usable entry" in ev["compile_cache"], ev
    assert third["params_fingerprint"] == first["params_fingerprint"]
    assert sorted(p.name for p in cache.iterdir()) == sorted(entries)  # written again


def test_an_entry_that_does_not_load_only_costs_a_compile(tmp_path):
    """A corrupt entry (a torn write, another jax version) reads as unloadable, never raises: the
    agreement above then has every process compile, as the partial-cache start shows."""
    import jax
    import jax.numpy as jnp

    from trainer.compile_cache import _load

    lowered = jax.jit(lambda x: x * 2).lower(jnp.ones(3))
    entry = tmp_path / "entry-p0.xla"
    entry.write_bytes(b"not an executable")
    executable, why = _load(str(entry), lowered)
    assert executable is None and why.startswith("unloadable ("), why
    assert _load(str(tmp_path / "missing"), lowered) == (None, "no entry")
