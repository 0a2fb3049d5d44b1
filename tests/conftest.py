"""Suite-wide: trainers started by tests keep their caches inside the test session, never in the
developer's home (the peak-probe cache defaults to ~/.cache/tpupod)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _session_cache_dir(tmp_path_factory):
    if "TPUPOD_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["TPUPOD_CACHE_DIR"] = str(tmp_path_factory.mktemp("tpupod-cache"))
    try:
        yield
    finally:
        os.environ.pop("TPUPOD_CACHE_DIR", None)
