"""Fixtures for trainer tests: spawned trainers (killed by pgid at teardown) and a
gcp-storage-emulator on 127.0.0.1 (a reusable function-level helper)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gcsfs
import pytest

from localpod.gcp.storage import emulator_command

# --import-mode=importlib puts no test directory on sys.path; the helpers live beside us.
sys.path.insert(0, str(Path(__file__).parent))
from trainer_testlib import Trainer, free_port, gcs_env, trainer_env  # noqa: E402


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
    applied to this test process, so gcsfs here sees the same bucket)."""
    port = free_port()
    proc = subprocess.Popen(
        emulator_command(port, "tpupod-test"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/storage/v1/b", timeout=1)
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("gcp-storage-emulator did not start") from None
                time.sleep(0.2)
        env = gcs_env(port)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        # fsspec keeps one GCSFileSystem per constructor arguments, made with the environment
        # of its day: an earlier test's (another emulator, or none: storage.googleapis.com).
        gcsfs.GCSFileSystem.clear_instance_cache()
        yield env
    finally:
        gcsfs.GCSFileSystem.clear_instance_cache()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
