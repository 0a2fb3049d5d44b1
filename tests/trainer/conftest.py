"""Fixtures for trainer tests: spawned trainers (killed by pgid at teardown) and a
gcp-storage-emulator on 127.0.0.1 (a reusable function-level helper)."""

from __future__ import annotations

import sys
from pathlib import Path

import fsspec.config
import gcsfs
import pytest

from localpod.gcp import storage

# --import-mode=importlib puts no test directory on sys.path; the helpers live beside us.
sys.path.insert(0, str(Path(__file__).parent))
from trainer_testlib import Trainer, gcs_env, trainer_env  # noqa: E402


@pytest.fixture
def spawn():
    """spawn(args, log_dir, name, devices=1, env=None) -> Trainer; all killed at teardown."""
    started: list[Trainer] = []

    def _spawn(args, log_dir, name, devices=1, env=None) -> Trainer:
        t = Trainer([str(a) for a in args], Path(log_dir), name, trainer_env(devices, env))
        started.append(t)
        return t

    try:
        yield _spawn
    finally:
        for t in started:
            t.kill()


@pytest.fixture
def gcs_emulator(monkeypatch):
    """A gcp-storage-emulator on 127.0.0.1 with bucket `tpupod-test`; yields its env vars (also
    applied to this test process, so gcsfs here sees the same bucket). Started as the benchmarks
    start theirs: on a port picked again if another process takes it first."""
    with storage.running_emulator("tpupod-test") as url:
        env = gcs_env(int(url.rsplit(":", 1)[1]))
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        # fsspec reads FSSPEC_GCS_TOKEN once, at its import: set here, this process's gcsfs would
        # still look for Google credentials, asking the GCE metadata server at 169.254.169.254.
        monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": env["FSSPEC_GCS_TOKEN"]})
        # fsspec keeps one GCSFileSystem per constructor arguments, made with the environment
        # of its day: an earlier test's (another emulator, or none: storage.googleapis.com).
        gcsfs.GCSFileSystem.clear_instance_cache()
        try:
            yield env
        finally:
            gcsfs.GCSFileSystem.clear_instance_cache()
