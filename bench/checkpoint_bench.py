"""Checkpoint overhead: training-loop wall time with async checkpoints at the goal's interval
over the time without (median of interleaved repeats), the same for synchronous ones, and SIGTERM
-> committed exit time (local disk). The pod-storage rows are bench.checkpoint_storage's.

    uv run python -m bench.checkpoint_bench [--config small] [--steps 30] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
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


# Issue 18's checkpoint-overhead goals (with checkpoints / without): tiny saving every 100 steps,
# small at its preset's own interval.
OVERHEAD_GOAL = {"tiny": 1.05, "small": 1.02}
GOAL_EVERY = {"tiny": 100}


def policy_every(config: str) -> int:
    """The interval the overhead goal holds for: the goal's own, else the preset's."""
    from trainer.config import load_config

    return GOAL_EVERY.get(config) or load_config(config).checkpoint_every


VARIANTS = {
    "none": ["checkpoint_every=0"],
    "async": ["checkpoint_async=true"],
    "sync": ["checkpoint_async=false"],
}


def loop_seconds(t) -> float:
    """The training loop's wall time less the one-off matmul peak probe inside it (its length
    varies from run to run and has nothing to do with checkpoints)."""
    return t.summary["train_loop_s"] - t.events.get("peak_measured", {}).get("seconds", 0.0)


def run(config: str = "small", steps: int = 30, every: int | None = None, repeats: int = 3):
    """Each variant `repeats` times, interleaved and rotated (none, async, sync; async, sync,
    none; ...): the machine's speed drifts by a few percent over minutes, as much as the overhead
    being measured, and interleaving spreads that drift over every variant instead of charging it
    to one; rotating keeps a variant from always running first (or last) in its round."""
    every = every or policy_every(config)
    loops: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    order: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        names = list(VARIANTS)
        for r in range(repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # each place once
                order.append(name)
                sets = VARIANTS[name] + ([f"checkpoint_every={every}"] if name != "none" else [])
                t = train(config, steps, str(Path(tmp) / f"{name}{r}"), [*sets, "keep_latest=10"])
                loops[name].append(loop_seconds(t))
                cpu[name].append(t.user_s + t.sys_s)
        term = sigterm_exit_seconds(config, steps, str(Path(tmp) / "term"))
    median = {name: statistics.median(v) for name, v in loops.items()}
    return {
        "config": config,
        "steps": steps,
        "checkpoint_every": every,
        "repeats": repeats,
        "run_order": order,
        "loop_s": loops,  # per variant, by round
        "cpu_s": cpu,  # the trainer process's user + system seconds, by round
        "loop_median_s": median,
        # Each round's ratio (runs minutes apart) and the ratio of medians, which is judged.
        "async_over_none_each": [a / n for a, n in zip(loops["async"], loops["none"], strict=True)],
        "sync_over_none_each": [a / n for a, n in zip(loops["sync"], loops["none"], strict=True)],
        "async_over_none": median["async"] / median["none"],
        "sync_over_none": median["sync"] / median["none"],
        "goal_async_over_none": OVERHEAD_GOAL.get(config)
        if every == policy_every(config)
        else None,
        "sigterm_to_exit_s": term["seconds"],
        "sigterm_exit_code": term["exit_code"],
        "sigterm_step": term["step"],
    }


def figures(r: dict) -> list:
    """BENCHMARKS.md rows: async overhead judged against the goal, sync beside it, SIGTERM exit."""
    from bench.report import Figure

    what = f"{r['config']}, {r['steps']} steps, every {r['checkpoint_every']}"
    runs = ", ".join(f"{k} {v:.1f}" for k, v in r["loop_median_s"].items())
    cpu = ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in r["cpu_s"].items())

    def overhead(name: str, goal=None) -> Figure:
        each = r[f"{name}_over_none_each"]
        return Figure(
            f"checkpoint overhead, {name} ({what})",
            r[f"{name}_over_none"],
            "x",
            f"<= {goal}" if goal else "",
            r[f"{name}_over_none"] <= goal if goal else None,
            n=len(each),
            spread=", ".join(f"{x:.3f}" for x in each),
            note=f"one process; median loop wall time (less the peak probe) over none's, the "
            f"variants interleaved {r['repeats']} times in rotated order (spread: each round's "
            f"ratio); median loop s: {runs}; median trainer CPU s: {cpu}",
        )

    return [
        overhead("async", r["goal_async_over_none"]),
        overhead("sync"),
        Figure(
            f"SIGTERM -> committed exit ({r['config']})",
            r["sigterm_to_exit_s"],
            "s",
            note=f"exit code {r['sigterm_exit_code']} at step {r['sigterm_step']}",
        ),
    ]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="small")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--every", type=int, default=None, help="default: the goal's interval")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    print(json.dumps(run(a.config, a.steps, a.every, a.repeats), indent=1))
