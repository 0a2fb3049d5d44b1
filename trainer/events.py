"""The trainer's JSON-lines contract on stdout: one JSON object per line, from process 0 only.

Every line carries `time` (unix seconds, ms resolution): readers such as bench.recovery_bench time
the trainer's phases by its own clock, not by when they happened to see a line. Free of jax on
purpose, so the CLI can announce `started` before the heavy imports.
"""

from __future__ import annotations

import json
import os
import time


def now() -> float:
    return round(time.time(), 3)


def write(doc: dict) -> None:
    print(json.dumps(doc), flush=True)


def event(name: str, **fields) -> None:
    """`{"event": name, "time": ..., **fields}`; `event` stays the first key (readers grep it)."""
    write({"event": name, "time": now(), **fields})


def promoted_at() -> float | None:
    """When this process, a standby parked since its start, was promoted to be the attempt
    (tpupod_job.standby); None for a cold start."""
    from tpupod_job.standby import PROMOTED_AT

    try:
        return float(os.environ[PROMOTED_AT])
    except (KeyError, ValueError):
        return None


def process_start_time() -> float | None:
    """When this process started (unix s, 10 ms resolution), from /proc: it includes the
    interpreter's own start-up, which no clock inside Python sees. None without /proc."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        # Field 22 (starttime, clock ticks after boot); split after the `(comm)` field, which may
        # hold spaces: field 3 is then index 0.
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return round(time.time() - age, 3)
