"""An experiment, not a judged benchmark: what `tpupod_job.wait_for_coordinator` saves when
process 1 reaches `jax.distributed.initialize` before process 0's coordination service listens.

    uv run python -m bench.coordinator_race --rounds 4

Per round: two CPU processes import JAX, then process 1 is released `--lead` seconds before
process 0, once without the wait and once with it (`tpupod_job.init`'s order); each prints how
long process 0's `initialize` took (what the slice waits). Without the wait, process 1's first
connect is refused and gRPC retries after its 1 s reconnect backoff."""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import os, sys, time
import jax, tpupod_job
pid, address, wait, release = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "wait", sys.argv[4]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
print("imported", flush=True)
while not os.path.exists(release):
    time.sleep(0.001)
if pid != 0 and wait:
    tpupod_job.wait_for_coordinator(address, 60)
started = time.monotonic()
jax.distributed.initialize(coordinator_address=address, num_processes=2, process_id=pid,
                           initialization_timeout=60)
print(f"{time.monotonic() - started:.4f}", flush=True)
jax.distributed.shutdown()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(mode: str, lead: float, folder: Path) -> float:
    """Process 0's initialize seconds with process 1 released `lead` seconds first."""
    address = f"127.0.0.1:{free_port()}"
    release = [folder / f"release-{mode}-{i}" for i in (0, 1)]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(i), address, mode, str(release[i])],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in (0, 1)
    ]
    try:
        for p in procs:  # both have imported JAX: a standby's state
            assert p.stdout.readline().strip() == "imported"
        release[1].touch()
        time.sleep(lead)
        release[0].touch()
        out = procs[0].communicate(timeout=120)[0].split()
        procs[1].communicate(timeout=120)
        return float(out[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.coordinator_race", description=__doc__)
    parser.add_argument("--rounds", type=int, default=4, help="rounds per mode [4]")
    parser.add_argument("--lead", type=float, default=0.15, help="process 1's head start, s")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("nowait", "wait"):
            seconds = [one_round(mode, args.lead, Path(tmp)) for _ in range(args.rounds)]
            print(f"{mode}: process 0's initialize median {statistics.median(seconds):.3f} s "
                  f"({', '.join(f'{s:.3f}' for s in seconds)})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
