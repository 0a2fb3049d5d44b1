"""tpupod_job, the helper every job may import (the built-in trainer does): its status writer,
and `init`'s keywords for a program with a start of its own. `init` runs in a child process: it
sets JAX's configuration and a SIGTERM handler for the whole process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import tpupod_job


def test_write_status_replaces_the_file_atomically(tmp_path):
    path = tmp_path / "deeper" / "status.json"
    tpupod_job.write_status({"step": 3, "state": "training"}, path)
    tpupod_job.write_status({"step": 4, "state": "saving"}, path)
    assert json.loads(path.read_text()) == {"step": 4, "state": "saving"}
    assert os.listdir(path.parent) == ["status.json"]  # no temporary file left behind


def test_write_status_and_progress_follow_the_contract(tmp_path, monkeypatch):
    monkeypatch.delenv("TPUPOD_STATUS_FILE", raising=False)
    tpupod_job.write_status({"step": 1})  # outside tpupod: nothing, no error
    tpupod_job.progress(1)
    status = tmp_path / "status.json"
    monkeypatch.setenv("TPUPOD_STATUS_FILE", str(status))
    monkeypatch.setenv("TPUPOD_PROCESS_ID", "2")
    tpupod_job.progress(7, loss=1.5)
    doc = json.loads(status.read_text())
    assert (doc["state"], doc["step"], doc["loss"], doc["process_id"]) == ("training", 7, 1.5, 2)


_CHILD = """
import os, signal, jax, tpupod_job
distributed = tpupod_job.init(distributed=False, jax_cache=False)
before = tpupod_job.should_stop(1)
os.kill(os.getpid(), signal.SIGTERM)
print(distributed, before, tpupod_job.should_stop(2), jax.config.jax_compilation_cache_dir)
"""


def test_init_keywords_decide_over_the_environment(tmp_path):
    """Two processes in the environment, but `distributed=False`: no coordinator is contacted,
    SIGTERM is caught and `should_stop` says so; `jax_cache=False` leaves JAX's cache off."""
    env = {**os.environ, "TPUPOD_NUM_PROCESSES": "2", "JAX_PLATFORMS": "cpu",
           "TPUPOD_COMPILE_CACHE": str(tmp_path / "cache")}  # fmt: skip
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout  # fmt: skip
    assert out.split() == ["False", "False", "True", "None"]


LOCAL_TIER_JOB = """
import os, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import tpupod_job

directory = sys.argv[1]
assert tpupod_job.open_local_tier(5) is None  # outside tpupod: no tier
os.environ["TPUPOD_LOCAL_CHECKPOINT_DIR"] = directory
assert tpupod_job.open_local_tier(0) is None  # turned off
mesh = Mesh(np.array(jax.devices()), ("x",))
split, whole = NamedSharding(mesh, P("x")), NamedSharding(mesh, P())
state = {"w": jax.device_put(jnp.arange(8, dtype=jnp.float32) / 3, split),
         "b": jax.device_put(jnp.full((3,), 0.1, jnp.bfloat16), whole),
         "step": jax.device_put(jnp.int32(10), whole)}
tier = tpupod_job.open_local_tier(5, shapes=("v1", (8,)))  # JSON turns the tuples to lists
assert tier.due(10) and not tier.due(11)
assert tier.save(10, state, extra=b'{"position": 10}')
tier.wait()
os.environ["TPUPOD_STATUS_FILE"] = status = os.path.join(os.path.dirname(directory), "st.json")
tpupod_job.progress(11)  # the status names the newest step the tier wrote whole
assert __import__("json").load(open(status))["local_checkpoint"] == 10
abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        state)
assert tier.agreed_step(None) == 10 and tier.agreed_step(10) == 10
assert tier.agreed_step(15) is None  # the bucket holds a newer step: it wins
got, extra = tier.restore(10, abstract)
assert extra == b'{"position": 10}'
for k in state:
    assert np.asarray(got[k]).tobytes() == np.asarray(state[k]).tobytes(), k
    assert got[k].sharding == state[k].sharding, k
assert tpupod_job.open_local_tier(5, shapes="v2").agreed_step(None) is None  # another state's copy
os.environ["TPUPOD_CHECKPOINT_DIR"] = "gs://b/runs/another"
assert tpupod_job.open_local_tier(5, shapes=("v1", (8,))).agreed_step(None) is None  # another run
del os.environ["TPUPOD_CHECKPOINT_DIR"]
with open(os.path.join(directory, "10", "arrays.bin"), "r+b") as f:
    first = f.read(1)
    f.seek(0)
    f.write(bytes([first[0] ^ 1]))
assert tier.agreed_step(None) is None  # a damaged copy is never offered
# Another sharding (w split, then whole): the tier works out its shards again.
state["w"] = jax.device_put(state["w"] * 2, whole)
assert tier.save(20, state)
tier.wait()
abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        state)
got, _ = tier.restore(20, abstract)
for k in state:
    assert np.asarray(got[k]).tobytes() == np.asarray(state[k]).tobytes(), k
print("ok")
"""


def test_a_jobs_local_tier_round_trips_a_sharded_state_bitwise_and_refuses_what_is_not_its(
    tmp_path,
):
    """`tpupod_job.open_local_tier` for any JAX job: a sharded state (two devices) and the job's own
    bytes back bitwise; not offered where the bucket is newer, for another state or run, or
    damaged."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUPOD_")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    run = subprocess.run([sys.executable, "-c", LOCAL_TIER_JOB, str(tmp_path / "local")],
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_wait_for_coordinator_returns_once_the_port_listens():
    """A process other than 0 waits for process 0's service before JAX connects (gRPC would
    back off a second after a refusal): True once a listener appears, False at the timeout with
    none (the control: the same port, closed)."""
    import socket
    import threading
    import time

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    assert tpupod_job.wait_for_coordinator(f"127.0.0.1:{port}", timeout_s=0.3) is False

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    later = threading.Timer(0.3, lambda: (server.bind(("127.0.0.1", port)), server.listen()))
    started = time.monotonic()
    later.start()
    try:
        assert tpupod_job.wait_for_coordinator(f"127.0.0.1:{port}", timeout_s=30) is True
        assert time.monotonic() - started >= 0.3  # it waited for the listener, not past it
    finally:
        later.join()
        server.close()


_BUDGET = """
import jax, tpupod_job
seen = {}
jax.distributed.initialize = lambda **kw: seen.update(kw)  # records what init passes, only
tpupod_job.init(timeout_s=3)
print(seen["initialization_timeout"])
"""


def test_the_coordinator_wait_and_initialize_share_one_timeout(tmp_path):
    """A coordinator that never listens costs `timeout_s` in all, not twice: process 1 waits it
    out and JAX gets what is left (1 s, its least); process 0 waits for nobody (the control)."""
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {**os.environ, "TPUPOD_NUM_PROCESSES": "2", "JAX_PLATFORMS": "cpu",
           "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}"}  # fmt: skip
    env.pop("TPUPOD_COMPILE_CACHE", None)
    given = {}
    for pid in ("1", "0"):
        run = subprocess.run([sys.executable, "-c", _BUDGET], env={**env, "TPUPOD_PROCESS_ID": pid},
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        given[pid] = int(run.stdout.split()[-1])
    assert given == {"1": 1, "0": 3}
