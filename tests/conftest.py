"""Suite-wide: trainers started by tests keep their caches inside the test session, never in the
developer's home (the peak-probe cache defaults to ~/.cache/tpupod). And the session writes
bytecode whatever the caller's PYTHONDONTWRITEBYTECODE: the suite starts hundreds of Python
processes (trainers, CLIs, pod agents), and with the variable set (as in some CI images) each one
compiles jax, flax, optax, grain and paramiko from source again. Local pods' workers are cold (their
own empty caches) and install from the bucket: the session's first pod builds its environments from
the package index and later pods' buckets start with them (localpod.env_seed)."""

from __future__ import annotations

import os
import sys

import pytest

from localpod.env_seed import SEED_VAR


@pytest.fixture(autouse=True, scope="session")
def _session_env(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        mp.setattr(sys, "dont_write_bytecode", False)
        if "TPUPOD_CACHE_DIR" not in os.environ:
            mp.setenv("TPUPOD_CACHE_DIR", str(tmp_path_factory.mktemp("tpupod-cache")))
        mp.setenv(SEED_VAR, str(tmp_path_factory.mktemp("env-seed")))
        yield
