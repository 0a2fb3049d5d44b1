"""Each benchmark's own flags, so that `python -m bench NAME --help` shows NAME's and no other's."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.runners import GOODPUT_SETS, REPO

# flag -> add_argument keywords; the help says which benchmarks read it only where it differs.
FLAGS: dict[str, dict] = {
    "--record": dict(type=Path, help="analyse this saved run (bench/out/*.json), run nothing"),
    "--preset": dict(default="tiny", help="the pod job's preset [tiny]"),
    "--set": dict(dest="sets", action="append", default=[], metavar="KEY=VALUE",
                  help=f"trainer --set for the job (repeatable) [{' '.join(GOODPUT_SETS)}]"),
    "--notice": dict(type=float, default=30.0, help="preemption notice, seconds [30]"),
    "--rounds": dict(type=int, default=3, help="events of each fault kind (>= 3) [3]"),
    "--min-steps": dict(type=int, default=30, help="steps between faults [30]"),
    "--no-reference": dict(dest="reference", action="store_false",
                           help="no uninterrupted run after the faulted ones (fingerprints: "
                           "each run against the others only)"),
    "--runs": dict(type=int, default=3, help="faulted runs, each from its own pod (>= 3) [3]"),
    "--period": dict(type=float, default=300.0, help="seconds between faults [300]"),
    "--steps": dict(type=int, default=6000, help="steps of the job [6000]"),
    "--faults": dict(default="notice,kill,crash,hang", help="fault kinds, in turn [%(default)s]"),
    "--trainer-config": dict(default="small", help="the trainer's preset [small]"),
    "--trainer-steps": dict(type=int, default=15, help="steps per run [15]"),
    "--checkpoint-steps": dict(type=int, default=30, help="steps per run [30]"),
    "--checkpoint-repeats": dict(type=int, default=3,
                                 help="interleaved runs of each variant (none, async, sync) [3]"),
    "--checkpoint-pod": dict(action="store_true",
                             help="on the 2-worker local pod (none, async), not in one process"),
    "--overhead-steps": dict(type=int, default=1500, help="steps per run (> 100) [1500]"),
    "--overhead-rounds": dict(type=int, default=5, help="interleaved rounds on the pod (tiny "
                              "without and with saves every 100 steps) [5]"),
    "--storage-runs": dict(type=int, default=3, help="runs of each storage case and of the "
                           "save-stall run (>= 3) [3]"),
    "--infra-runs": dict(type=int, default=3, help="fresh interpreters, one after the other (>= 3) [3]"),
    "--job": dict(type=Path, default=REPO / "examples" / "jobs" / "flax-plain",
                  help="the job directory [examples/jobs/flax-plain]"),
    "--job-rounds": dict(type=int, default=5, help="overhead rounds (>= 3) [5]"),
    "--count": dict(type=int, default=100, help="how many faults in all [100]"),
    "--seed": dict(type=int, default=0, help="seed of the random mix [0]"),
    "--per-leg": dict(type=int, default=25, help="faults per pod run (leg) [25]"),
    "--legs": dict(type=int, default=None, help="run at most this many more legs now (0: "
                   "report the saved ones) [all]"),
    "--storage-errors": dict(type=float, default=0.0, help="share of the bucket's requests that "
                             "fail (429, 503, dropped) through every leg [0]"),
}  # fmt: skip

BY_BENCHMARK: dict[str, tuple[str, ...]] = {
    "trainer": ("--trainer-config", "--trainer-steps"),
    "gpu": ("--trainer-steps", "--set"),
    "checkpoint": ("--record", "--trainer-config", "--checkpoint-steps", "--checkpoint-repeats",
                   "--checkpoint-pod"),
    "storage": ("--record", "--storage-runs"),
    "overhead": ("--record", "--overhead-steps", "--overhead-rounds"),
    "verify": ("--record",),
    "infra": ("--infra-runs",),
    "recovery": ("--record", "--preset", "--set", "--min-steps", "--rounds", "--notice"),
    "recovery-compute": ("--record", "--preset", "--set", "--min-steps", "--rounds", "--notice"),
    "job": ("--record", "--job", "--job-rounds", "--rounds", "--notice"),
    "capacity": ("--record", "--rounds", "--min-steps"),
    "coldboot": ("--record", "--rounds"),
    "goodput": ("--record", "--period", "--steps", "--faults", "--preset", "--set", "--notice"),
    "goodput-survive": ("--record", "--runs", "--period", "--steps", "--preset", "--set", "--notice",
                        "--no-reference"),
    "goodput-pinned": ("--record", "--runs", "--period", "--steps", "--preset", "--set", "--notice",
                       "--no-reference"),
    "cost": (),
    "faults": ("--count", "--seed", "--per-leg", "--preset", "--set", "--notice",
               "--storage-errors", "--legs"),
}  # fmt: skip


def add_flags(parser: argparse.ArgumentParser, name: str) -> None:
    for flag in BY_BENCHMARK[name]:
        parser.add_argument(flag, **FLAGS[flag])


def check(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """The limits of a benchmark's flags (the judging rules need at least 3 runs or events)."""
    if getattr(a, "count", 1) < 1 or getattr(a, "per_leg", 1) < 1:
        parser.error(f"--count {a.count} / --per-leg {a.per_leg}: both must be at least 1")
    if getattr(a, "overhead_steps", 101) <= 100 or getattr(a, "overhead_rounds", 1) < 1:
        parser.error(f"--overhead-steps {a.overhead_steps} / --overhead-rounds "
                     f"{a.overhead_rounds}: a run needs more steps than one interval (100), and "
                     "at least 1 round")  # fmt: skip
    if getattr(a, "job_rounds", 3) < 3:
        parser.error(
            f"--job-rounds {a.job_rounds}: the overhead goal is a median of at least 3 runs"
        )
    if getattr(a, "rounds", 3) < 3:
        parser.error(
            f"--rounds {a.rounds}: the recovery goal is a median of at least 3 events a kind"
        )
    if getattr(a, "runs", 3) < 1:
        parser.error(f"--runs {a.runs}: at least one run (the goodput goals need 3 to be judged)")
