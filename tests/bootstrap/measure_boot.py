"""Time from worker boot to the first training step, two workers, real trainer (not a test).

    uv run python tests/bootstrap/measure_boot.py                  # local pod, warm uv cache
    uv run python tests/bootstrap/measure_boot.py --via harness    # same, the tests' bare slice
    uv run python tests/bootstrap/measure_boot.py --via harness --cold   # empty uv cache: PyPI

The local pod always hands its workers the operator's uv cache and passes no TLS settings, so a
cold cache is measured on the tests' bare slice (the local pod's metadata server, emulator and
worker environment, without agents or SSH), online, with UV_NATIVE_TLS=1 for TLS-intercepting
networks. Boot = the worker agent's process start (local pod) or the script's start (harness);
first step = the first status.json saying training at step >= 1 (polled every 50 ms).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from localpod import procs
from localpod.pod import LocalPod

TRAINER_ARGS = "--config tiny --steps 100000"


def process_start_unix(pid: int) -> float:
    """A process's start as unix time, from /proc (clock ticks since the machine booted)."""
    stat = Path("/proc/stat").read_text().splitlines()
    btime = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
    return btime + procs.start_time(pid) / os.sysconf("SC_CLK_TCK")


def read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def trainer_started(log: Path) -> float | None:
    """The launcher's first line of the job (bootstrap/jobrun.py, to the second)."""
    match = re.search(r"jobrun: (\S+Z) attempt", log.read_text()) if log.exists() else None
    return datetime.fromisoformat(match.group(1)).timestamp() if match else None


def wait_first_steps(roots: dict[int, Path], timeout: float) -> dict[int, float]:
    first: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(first) < len(roots) and time.monotonic() < deadline:
        for i, root in roots.items():
            status = read(root / "status.json")
            if i not in first and status and status["state"] == "training" and status["step"] >= 1:
                first[i] = time.time()
            if (read(root / "bootstrap.json") or {}).get("state") == "failed":
                raise SystemExit(f"worker {i} bootstrap failed: {read(root / 'bootstrap.json')}")
        time.sleep(0.05)
    return first


def report(roots: dict[int, Path], boots: dict[int, float], first: dict[int, float]) -> list[dict]:
    rows = []
    for i, root in roots.items():
        boot = read(root / "bootstrap.json") or {}
        rows.append(
            {
                "worker": i,
                "boot_to_script": round(boot.get("started", 0) - boots[i], 2),
                "phases": {p["name"]: p["seconds"] for p in boot.get("phases", [])},
                "boot_to_trainer_start": round(
                    (trainer_started(root / "job.log") or 0) - boots[i], 1
                ),
                "boot_to_first_step": round(first[i] - boots[i], 2) if i in first else None,
                "uv": [
                    line.split("] ", 1)[1]
                    for line in (root / "bootstrap.log").read_text().splitlines()
                    if re.search(r"\[sync\] (Prepared|Installed|Audited|Checked)", line)
                ],
            }
        )
    return rows


def via_localpod(tmp: Path, timeout: float) -> list[dict]:
    pod = LocalPod(tmp / "pod", workers=2, trainer_args=TRAINER_ARGS)
    try:
        info = pod.up()
        boots = {w.index: process_start_unix(w.agent_pid) for w in info.workers}
        roots = {i: pod.paths.tpupod_root(i) for i in boots}
        return report(roots, boots, wait_first_steps(roots, timeout))
    finally:
        pod.down()


def via_harness(tmp: Path, timeout: float, cold: bool) -> list[dict]:
    spec = importlib.util.spec_from_file_location(
        "bootstrap_harness", Path(__file__).with_name("conftest.py")
    )
    harness = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = harness
    spec.loader.exec_module(harness)
    harness.TRAINER_ARGS = TRAINER_ARGS
    extra = (
        {"UV_CACHE_DIR": str(tmp / "uv-cache"), "UV_OFFLINE": "0", "UV_NATIVE_TLS": "1"}
        if cold
        else {}
    )
    root = harness.stage_bundle_root(tmp / "bundle")
    bundle = harness.build_bundle(root)
    with harness._make_slice(tmp, 2) as pod:
        try:
            pod.publish(bundle)
            boots = {i: time.time() for i in (0, 1)}
            results = pod.boot(**extra)  # both at once; returns when both scripts are done
            for result in results:
                if result.returncode:
                    raise SystemExit(result.output[-3000:])
            roots = {i: pod.root(i) for i in (0, 1)}
            return report(roots, boots, wait_first_steps(roots, timeout))
        finally:
            pod.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--via", choices=["localpod", "harness"], default="localpod")
    parser.add_argument("--cold", action="store_true", help="empty uv cache (harness only)")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    if args.cold and args.via != "harness":
        parser.error(
            "--cold needs --via harness (the local pod always shares the operator's cache)"
        )
    # SIGTERM (e.g. from `timeout`) unwinds through the finally blocks that stop the pod.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="tpupod-measure-") as tmp:
        if args.via == "localpod":
            rows = via_localpod(Path(tmp), args.timeout)
        else:
            rows = via_harness(Path(tmp), args.timeout, args.cold)
    for row in rows:
        print(json.dumps({"via": args.via, "cache": "cold" if args.cold else "warm", **row}))


if __name__ == "__main__":
    main()
