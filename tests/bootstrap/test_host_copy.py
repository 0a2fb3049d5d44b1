"""What a save costs the loop on either tier (tpupod_job.host_copy): the state's copy to host
memory, dispatched in one call for the whole state and not awaited; the next step donates the
state and the copy still holds the saved values. The local tier's save takes the same copy, so
it returns while the step computing the state still runs, and the step it wrote restores
bitwise equal."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tpupod_job import host_copy as hc
from tpupod_job.local_tier import LocalTier


def _donating_step():
    return jax.jit(lambda s: jax.tree.map(lambda x: x * 3 + 1, s), donate_argnums=0)


def _slow_step():
    """A step that takes a while on one CPU (~0.3 s), so a save can meet it in flight."""
    return jax.jit(lambda s: {"w": jax.lax.fori_loop(
        0, 300, lambda i, w: jnp.tanh(w @ w / 512.0), s["w"])})  # fmt: skip


def test_the_host_copy_outlives_the_donated_state():
    state = {"w": jnp.arange(1024, dtype=jnp.float32), "step": jnp.int32(7), "note": "kept"}
    expected = {k: np.array(v) for k, v in state.items() if k != "note"}
    copy = hc.host_copy(state)
    _donating_step()({k: v for k, v in state.items() if k != "note"})
    assert state["w"].is_deleted()  # negative control: the saved arrays themselves are gone
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(state["w"])
    assert copy["note"] == "kept"  # a leaf that is no array passes through as it is
    for key, value in expected.items():
        assert np.array_equal(np.asarray(copy[key]), value)


def test_the_whole_state_is_copied_in_one_dispatch(monkeypatch):
    """One transfer call for all leaves: per-leaf dispatch is what made a save cost the local
    pod's loop 20-40 ms (the module's docstring)."""
    calls: list = []
    real = jax.device_put
    monkeypatch.setattr(hc.jax, "device_put", lambda *a, **k: calls.append(a) or real(*a, **k))
    state = {f"w{i}": jnp.full((8,), float(i)) for i in range(12)}
    copy = hc.host_copy(state)
    assert len(calls) == 1 and len(calls[0][0]) == 12, calls
    for i in range(12):
        assert np.array_equal(np.asarray(copy[f"w{i}"]), np.full((8,), float(i)))


def test_the_copy_does_not_wait_for_the_step_still_computing_the_state():
    """The loop saves the state of a step still running: the copy is dispatched and the loop
    goes on; the next step donates that state, and the copy still holds the step's values.
    Control: awaiting the copy takes the rest of the step (so the step was in flight)."""
    slow = _slow_step()
    start = {"w": jax.random.normal(jax.random.key(0), (512, 512), jnp.float32)}
    expected = np.array(slow(start)["w"])  # also compiles it
    t0 = time.perf_counter()
    state = slow(start)  # in flight
    copy = hc.host_copy(state)
    dispatched = time.perf_counter() - t0
    _donating_step()(state)  # the next step donates the state the copy reads
    ready = jax.block_until_ready(copy)
    done = time.perf_counter() - t0
    assert state["w"].is_deleted() and done >= 0.2, done  # control: a step that takes a while
    assert dispatched < done / 3, (dispatched, done)
    assert np.array_equal(np.asarray(ready["w"]), expected)


def test_with_two_processes_the_copy_does_not_wait_for_the_step_either():
    """Two real processes (jax.distributed, gloo): the state's arrays span both, and their own
    `device_put` to host memory waits for the step computing them (the control: so the step was
    in flight and a copy that waits would show); `host_copy` does not."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONWARNINGS": "ignore",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}  # fmt: skip
    script = Path(__file__).with_name("host_copy_pair.py")
    procs = [subprocess.Popen([sys.executable, script, str(i), port], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True) for i in range(2)]  # fmt: skip
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        got = json.loads(out.strip().splitlines()[-1])
        control, ours = got["global_device_put"], got["host_copy"]
        assert control["call_ms"] > control["step_ms"] / 2, got  # it waited for the step
        assert ours["call_ms"] < ours["step_ms"] / 4, got


def test_without_pinned_host_memory_the_copy_stays_in_place_and_outlives_the_donation(
    monkeypatch,
):
    """Devices without a `pinned_host` memory kind get a copy where the array is: still a copy
    (`may_alias=False`), which the step cannot donate."""
    monkeypatch.setattr(hc, "_has_pinned_host", lambda devices: False)
    state = {"w": jnp.arange(256, dtype=jnp.float32)}
    expected = np.array(state["w"])
    copy = hc.host_copy(state)
    assert copy["w"].sharding.memory_kind == state["w"].sharding.memory_kind
    _donating_step()(state)
    assert state["w"].is_deleted()
    assert np.array_equal(np.asarray(copy["w"]), expected)


def test_pinned_host_memory_is_looked_up_once_per_device_set():
    hc._has_pinned_host.cache_clear()
    state = {"a": jnp.zeros(4), "b": jnp.ones(4)}
    for _ in range(3):
        hc.host_copy(state)
    assert hc._has_pinned_host.cache_info().misses == 1


def test_a_local_save_returns_while_the_step_computes_and_restores_bitwise(tmp_path):
    """The local tier's save dispatches the copy and hands it to its writer: it returns long
    before the step in flight ends (control: awaiting that step), the next step donates the
    state, and the step written restores equal to the state as it was at the save."""
    slow = _slow_step()
    start = {"w": jax.random.normal(jax.random.key(1), (512, 512), jnp.float32)}
    expected = np.array(slow(start)["w"])  # also compiles it
    tier = LocalTier(str(tmp_path / "local"), every=1, identity={"process_index": 0})
    t0 = time.perf_counter()
    state = slow(start)  # in flight
    assert tier.save(4, state, extra=b"data")
    returned = time.perf_counter() - t0
    _donating_step()(state)
    tier.wait()
    done = time.perf_counter() - t0
    assert state["w"].is_deleted() and done >= 0.2, done
    assert returned < done / 3, (returned, done)
    assert 0 < tier.blocked_s <= returned  # what the loop paid, as the status reports it
    assert tier.steps() == [4] and tier.verified(4) is not None
    abstract = {"w": jax.ShapeDtypeStruct(expected.shape, expected.dtype,
                                          sharding=state["w"].sharding)}  # fmt: skip
    restored, extra = tier.restore(4, abstract)
    assert extra == b"data"
    assert np.array_equal(np.asarray(restored["w"]), expected)


def test_a_local_save_works_out_its_shards_once_per_tree_and_writes_each_saves_values(
    tmp_path, monkeypatch
):
    """The keys and shards a save writes are worked out at the first save and again only when
    the tree, a shape or a sharding changes; every save still writes the state it was given."""
    from tpupod_job import local_tier

    keyed = []
    real_key = local_tier._key
    monkeypatch.setattr(local_tier, "_key", lambda *a: keyed.append(a) or real_key(*a))
    tier = LocalTier(str(tmp_path / "local"), every=1, identity={"process_index": 0})
    states = [{"a": jnp.full(4, float(i)), "b": jnp.arange(3) + i} for i in range(3)]
    for step, state in enumerate(states, 1):
        assert tier.save(step, state)
        tier.wait()
    assert len(keyed) == 2  # two leaves, once
    wider = {"a": jnp.full(8, 7.0), "b": jnp.arange(3)}
    assert tier.save(4, wider)
    tier.wait()
    assert len(keyed) == 4  # a shape changed: worked out again
    for step, state in [(3, states[2]), (4, wider)]:
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                               sharding=x.sharding), state)  # fmt: skip
        restored, _ = tier.restore(step, abstract)
        for name in state:
            assert np.array_equal(np.asarray(restored[name]), np.asarray(state[name])), step
