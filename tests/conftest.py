"""Suite-wide: trainers started by tests keep their caches inside the test session, never in the
developer's home (the peak-probe cache defaults to ~/.cache/tpupod). And the session writes
bytecode whatever the caller's PYTHONDONTWRITEBYTECODE: the suite starts hundreds of Python
processes (trainers, CLIs, pod agents), and with the variable set (as in some CI images) each one
compiles jax, flax, optax, grain and paramiko from source again. Local pods' workers are cold (their
own empty caches) and install from the bucket: the session's first pod builds its environments from
the package index and later pods' buckets start with them (localpod.env_seed).

The README's test command runs the suite on two pytest-xdist processes (the machines have two
cores, and most of a pod test is waiting): every test that drives a local pod is in one xdist
group, so pods run one at a time, in one process whose session seeds the bucket's environments
once, beside the trainer, ops and infra tests."""

from __future__ import annotations

import os
import sys

import pytest

from localpod.env_seed import SEED_VAR

POD_DIRS = {"e2e", "localpod", "bootstrap"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = set(item.path.relative_to(config.rootpath).parts[:2])
        if "tests" in parts and parts & POD_DIRS or item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.xdist_group("pod"))


@pytest.fixture(autouse=True, scope="session")
def _session_env(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        mp.setattr(sys, "dont_write_bytecode", False)
        if "TPUPOD_CACHE_DIR" not in os.environ:
            mp.setenv("TPUPOD_CACHE_DIR", str(tmp_path_factory.mktemp("tpupod-cache")))
        mp.setenv(SEED_VAR, str(tmp_path_factory.mktemp("env-seed")))
        yield
