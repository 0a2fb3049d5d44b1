"""Suite-wide: trainers started by tests keep their caches inside the test session, never in the
developer's home (the peak-probe cache defaults to ~/.cache/tpupod)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _session_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        if "TPUPOD_CACHE_DIR" not in os.environ:
            mp.setenv("TPUPOD_CACHE_DIR", str(tmp_path_factory.mktemp("tpupod-cache")))
        yield
