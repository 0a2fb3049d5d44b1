"""Goodput of a real run, from the watcher's journal alone (the bucket's copy, or a journal file):
productive time over wall time, as Google's ml-goodput-measurement defines it, with the badput
split into the categories the journal can tell apart.

What the journal holds: `watching` (the watch began), `progress` (the run's newest step, at most
every PROGRESS_EVERY_S: ops.watch.progress), each incident's `detected` and `resumed` (its
`recovery_s` and `steps_lost`), `done`. From those:
  step time           the median seconds per step between two progress samples with no incident
                      between them (a sample pair that spans a recovery is not a step's time)
  productive          the final step times the step time: the work that was kept
  infrastructure      each incident's detection -> resumed (delete, create, bootstrap, restart,
  recovery            the restore and compile of the restarted job); an open one up to the end
  wasted progress     the steps each incident lost times the step time
  other               the rest of the wall time: the first start (initialization, compile),
                      checkpoint saves that held the loop, data loading, detection delays
The worker-side split of `other` (Google's TPU initialization, program startup, data loading,
checkpoint save) needs the jobs' status history, which the bucket does not keep: bench/badput.py
makes that finer split on the local pod, where every status file is read.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

CATEGORIES = ("productive", "infrastructure recovery", "wasted progress", "other")


@dataclass
class Goodput:
    wall_s: float
    final_step: int
    step_s: float | None  # None: fewer than two progress samples outside incidents
    seconds: dict[str, float] = field(default_factory=dict)  # category -> seconds (sum: wall)
    incidents: int = 0
    finished: bool = False  # the journal ends with `done`

    @property
    def goodput(self) -> float | None:
        if self.step_s is None or self.wall_s <= 0:
            return None
        return self.seconds["productive"] / self.wall_s


def step_seconds(records: list[dict]) -> float | None:
    """Median seconds per step between consecutive progress samples no incident separates."""
    rates, last = [], None
    for r in records:
        if r.get("event") == "detected":
            last = None
        elif r.get("event") == "progress" and isinstance(r.get("step"), int):
            if last is not None and r["step"] > last["step"]:
                rates.append((r["time"] - last["time"]) / (r["step"] - last["step"]))
            last = r
    return statistics.median(rates) if rates else None


def last_run(records: list[dict]) -> list[dict]:
    """The records of the stack's newest run: a stack's journal holds every run watched on it,
    each ended by `done` (a watcher restarted within a run says `watching` again, not `done`)."""
    ends = [i for i, r in enumerate(records) if r.get("event") == "done"]
    if not ends:
        return records
    if ends[-1] < len(records) - 1 and any(r.get("event") == "watching"
                                           for r in records[ends[-1] + 1 :]):  # fmt: skip
        return records[ends[-1] + 1 :]  # a newer run under way
    return records[ends[-2] + 1 : ends[-1] + 1] if len(ends) > 1 else records[: ends[-1] + 1]


def measure(records: list[dict], now: float) -> Goodput:
    """The newest run's goodput from the journal's records (oldest first); `now` ends a run
    still under way. Productive work is the steps made while watched (from the first sample)."""
    timed = [r for r in last_run(records) if isinstance(r.get("time"), int | float)]
    if not timed:
        return Goodput(0.0, 0, None, dict.fromkeys(CATEGORIES, 0.0))
    start = next((r["time"] for r in timed if r.get("event") == "watching"), timed[0]["time"])
    done = next((r for r in timed if r.get("event") == "done"), None)
    end = done["time"] if done else now
    wall = max(0.0, end - start)
    steps = [r["step"] for r in timed if r.get("event") in ("progress", "done")
             and isinstance(r.get("step"), int)]  # fmt: skip
    final = steps[-1] if steps else 0
    first = steps[0] if steps else 0  # a watch that began mid-run counts from there
    step_s = step_seconds(timed)
    recovery, lost_steps, opened, incidents = 0.0, 0, None, 0
    for r in timed:
        if r.get("event") == "detected" and opened is None:
            opened, incidents = r["time"], incidents + 1
        elif r.get("event") == "resumed" and opened is not None:
            recovery += float(r.get("recovery_s") or r["time"] - opened)
            lost_steps += int(r.get("steps_lost") or 0)
            opened = None
    if opened is not None:
        recovery += max(0.0, end - opened)
    # Recovery is measured (time stamps); the two step-time estimates get what is left, in turn.
    recovery = min(recovery, wall)
    wasted = min(lost_steps * (step_s or 0.0), wall - recovery)
    productive = min((final - first) * (step_s or 0.0), wall - recovery - wasted)
    seconds = {"productive": productive, "infrastructure recovery": recovery,
               "wasted progress": wasted, "other": wall - recovery - wasted - productive}  # fmt: skip
    return Goodput(wall, final, step_s, seconds, incidents, done is not None)
