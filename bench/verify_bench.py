"""What checking a step's manifest (trainer/manifest.py) adds to a restore, on the pod's GCS
emulator (OCDBT), for `tiny` and `small`: each preset trains a few steps with a save at the end,
then restarts `restores` times; every restart's `restored` event gives the whole restore's seconds
(listing, manifest checks, every read) and the checks' own (`verify_s`). The rule, fixed before
the runs: the median of the checks' seconds over the median of the rest (restore without them)
<= 0.10, over >= 3 restores.

    uv run python -m bench verify
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from bench.report import Figure
from bench.storage_trainer import emulator, events_in, start_trainer

GOAL = 0.10
STEPS = {"tiny": 6, "small": 3}


def restores(config: str, count: int, env: dict, cache: str) -> list[dict]:
    """`restored` events of `count` restarts of one run of `config` (a save at its last step)."""
    workdir = f"gs://tpupod-bench/runs/verify-{config}"
    steps = STEPS[config]
    proc = start_trainer(config, steps, workdir, [f"checkpoint_every={steps}"], env, cache)
    proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{config}: the first run exited {proc.returncode}")
    found = []
    for _ in range(count):
        proc = start_trainer(config, steps, workdir, [f"checkpoint_every={steps}"], env, cache)
        out, _ = proc.communicate(timeout=1800)
        restored = events_in(out).get("restored")
        if proc.returncode != 0 or restored is None:
            raise RuntimeError(f"{config}: a restart exited {proc.returncode} without a restore")
        found.append({"seconds": restored["seconds"], "verify_s": restored["verify_s"]})
    return found


def run(count: int = 5) -> dict:
    with tempfile.TemporaryDirectory() as tmp, emulator(Path(tmp) / "gcs.log") as env:
        return {config: restores(config, count, env, f"{tmp}/cache") for config in STEPS}


def figures(result: dict) -> list[Figure]:
    figs = []
    for config, events in result.items():
        verify = [e["verify_s"] for e in events]
        rest = [e["seconds"] - e["verify_s"] for e in events]
        ratio = statistics.median(verify) / statistics.median(rest)
        each = [v / r for v, r in zip(verify, rest, strict=True)]
        figs.append(Figure(
            f"restore: manifest checks / the rest of the restore, {config}", ratio, "x",
            f"<= {GOAL:g} (ratio of medians, >= 3 restores)", len(events) >= 3 and ratio <= GOAL,
            n=len(events), spread=f"{min(each):.3f}-{max(each):.3f} x",
            note=f"the pod's GCS emulator, OCDBT; checks {statistics.median(verify) * 1e3:.0f} ms, "
            f"the rest (listing, compatibility, every read) {statistics.median(rest):.2f} s "
            "(medians); spread: each restore's ratio",
        ))  # fmt: skip
    return figs
