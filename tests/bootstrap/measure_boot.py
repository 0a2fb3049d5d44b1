"""Time from worker boot to the first training step in the local pod (not a test).

    uv run python tests/bootstrap/measure_boot.py            # warm uv cache (the operator's)
    uv run python tests/bootstrap/measure_boot.py --cold     # empty uv cache: wheels from PyPI

Boot = the worker agent's process start (the "VM" coming up); the startup script then runs from
metadata. First step = the first status.json that says training at step >= 1 (polled every
50 ms). Prints per-phase seconds from bootstrap.json and where the trainer's own time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from datetime import datetime
from pathlib import Path

from localpod import procs
from localpod.pod import LocalPod


def process_start_unix(pid: int) -> float:
    """A process's start as unix time, from /proc (clock ticks since the machine booted)."""
    btime = next(
        int(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime")
    )
    return btime + procs.start_time(pid) / os.sysconf("SC_CLK_TCK")


def read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def trainer_started(log: Path) -> float | None:
    match = re.search(r"trainerctl: (\S+Z) starting", log.read_text()) if log.exists() else None
    return datetime.fromisoformat(match.group(1)).timestamp() if match else None


def measure(pod_dir: Path, timeout: float) -> list[dict]:
    pod = LocalPod(pod_dir, workers=2, trainer_args="--config tiny --steps 100000")
    t_up = time.time()
    try:
        info = pod.up()
        boots = {w.index: process_start_unix(w.agent_pid) for w in info.workers}
        roots = {i: pod.paths.home(i) / "tpupod" for i in boots}
        first: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        while len(first) < len(roots) and time.monotonic() < deadline:
            for i, root in roots.items():
                status = read(root / "status.json")
                if (
                    i not in first
                    and status
                    and status["state"] == "training"
                    and status["step"] >= 1
                ):
                    first[i] = time.time()
            time.sleep(0.05)
        rows = []
        for i, root in roots.items():
            boot = read(root / "bootstrap.json") or {}
            rows.append(
                {
                    "worker": i,
                    "up_call_to_boot": round(boots[i] - t_up, 2),
                    "boot_to_script": round(boot.get("started", 0) - boots[i], 2),
                    "phases": {p["name"]: p["seconds"] for p in boot.get("phases", [])},
                    "boot_to_trainer_start": round(
                        (trainer_started(root / "trainer.log") or 0) - boots[i], 1
                    ),
                    "boot_to_first_step": round(first[i] - boots[i], 2) if i in first else None,
                }
            )
        return rows
    finally:
        pod.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="start with an empty uv cache")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpupod-measure-") as tmp:
        if args.cold:
            # The pod hands its workers `uv cache dir`, which follows UV_CACHE_DIR.
            os.environ["UV_CACHE_DIR"] = str(Path(tmp) / "uv-cache")
        for row in measure(Path(tmp) / "pod", args.timeout):
            print(json.dumps({"cache": "cold" if args.cold else "warm", **row}))


if __name__ == "__main__":
    main()
