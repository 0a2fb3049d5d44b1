"""A `python -m trainer` on the pod's storage (the GCS emulator on loopback), as the checkpoint
benchmarks run it: the emulator, the trainer process, and what its stdout says (events, steps)."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.trainer_bench import REPO

BUCKET = "tpupod-bench"


@contextlib.contextmanager
def emulator(log: Path):
    """The pod's GCS emulator (localpod.gcp.emulator) on a free loopback port; yields its env."""
    from localpod.gcp.storage import running_emulator

    with running_emulator(BUCKET, log) as url:
        yield {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
               "GOOGLE_AUTH_TOKEN_FOR_TESTING": "x", "FSSPEC_GCS_TOKEN": "anon",
               "NO_GCE_CHECK": "true", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}  # fmt: skip


def start_trainer(config, steps, workdir, sets, env, cc) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "trainer", "--config", config, "--steps", str(steps),
           "--workdir", workdir, "--compile-cache", cc, "--set", "log_every=1"]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"), **env}
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip


def events_in(out: str) -> dict[str, dict]:
    """The last line of each event name in a trainer's stdout."""
    found = {}
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            r = json.loads(line)
            if isinstance(r, dict) and "event" in r:
                found[r["event"]] = r
    return found


def until_step(proc: subprocess.Popen, step: int) -> str:
    """Reads the run's stdout until it logs `step`; returns what it read."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(f'{{"step": {step},'):
            break
    return "".join(seen)


def step_times(out: str) -> list[float]:
    """Every `step_time` a trainer logged (log_every=1: one a step), the first with the compile."""
    times = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            if isinstance(r := json.loads(line), dict) and "step_time" in r:
                times.append(r["step_time"])
    return times


def median_step(times: list[float]) -> float | None:
    """The median of a run's step seconds, the first (which holds the compile) left out."""
    return statistics.median(times[1:] or times) if times else None


def median_step_time(out: str) -> float | None:
    return median_step(step_times(out))
