"""Checkpoint cost: training-loop wall time with async checkpoints every 10 steps over the time
without (goal <= 1.02), the same for synchronous ones, and SIGTERM -> committed exit time.

    uv run python -m bench.checkpoint_bench [--config small] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.trainer_bench import REPO, train


def sigterm_exit_seconds(config: str, steps: int, workdir: str) -> dict:
    """Starts a run, sends SIGTERM after the second logged step, times the exit (code 75)."""
    cmd = [sys.executable, "-m", "trainer", "--config", config, "--steps", str(steps),
           "--workdir", workdir, "--compile-cache", os.path.join(workdir, "cc"),
           "--set", "log_every=1"]  # fmt: skip
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip
    try:
        for line in proc.stdout:
            if line.startswith('{"step": 2,'):
                break
        sent = time.perf_counter()
        os.kill(proc.pid, signal.SIGTERM)
        out = proc.stdout.read()
        code = proc.wait(timeout=120)
        seconds = time.perf_counter() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    preempted = [json.loads(x) for x in out.splitlines() if '"event": "preempted"' in x]
    return {
        "exit_code": code,
        "seconds": seconds,
        "step": preempted[0]["step"] if preempted else None,
    }


def run(config: str = "small", steps: int = 30, every: int = 10) -> dict:
    loops = {}
    with tempfile.TemporaryDirectory() as tmp:
        variants = {
            "none": ["checkpoint_every=0"],
            "async": [f"checkpoint_every={every}", "checkpoint_async=true"],
            "sync": [f"checkpoint_every={every}", "checkpoint_async=false"],
        }
        for name, sets in variants.items():
            t = train(config, steps, str(Path(tmp) / name), [*sets, "keep_latest=10"])
            loops[name] = t.summary["train_loop_s"]
        term = sigterm_exit_seconds(config, steps, str(Path(tmp) / "term"))
    return {
        "config": config,
        "steps": steps,
        "checkpoint_every": every,
        "loop_s": loops,
        "async_over_none": loops["async"] / loops["none"],
        "sync_over_none": loops["sync"] / loops["none"],
        "goal_async_over_none": 1.02,
        "sigterm_to_exit_s": term["seconds"],
        "sigterm_exit_code": term["exit_code"],
        "sigterm_step": term["step"],
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="small")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=10)
    a = p.parse_args()
    print(json.dumps(run(a.config, a.steps, a.every), indent=1))
