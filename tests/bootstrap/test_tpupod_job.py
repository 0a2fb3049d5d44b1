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
