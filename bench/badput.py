"""Goodput and badput as ml-goodput-measurement defines them, from what a pod run leaves behind.

The faulted run's wall time (first training step -> watch `done`) is split, by worker 0's trainer
processes (status.json changes and their start-up events), into:
  productive            stepping towards steps that were kept
  startup               process start (a standby's: its promotion) -> `setup` (interpreter,
                        imports, JAX init, mesh, data)
  restore               `setup` -> status `compiling` (the checkpoint restore; its `restored`
                        event when the sampler missed a short `compiling`)
  compile               `compiling` -> the first `training`
  checkpoint save       status `saving` (the loop blocked on a save, a save on notice included),
                        and the loop's time in the local tier's saves, which keep `training`
                        (the trainer's own count, `local_save_s`: taken from productive)
  lost progress         stepping towards steps a disruption threw away (past the next restore)
  recovery / infra      one trainer's last word -> the next one's process start (detection, slice
                        delete + create, bootstrap, restart)
  other                 the rest (peak probes, sampling edges); by construction all add up to wall
Google's goodput is productive / wall. The headline this repo judges is stricter about what
"productive" means: the time the uninterrupted reference WITH THE SAME CHECKPOINT POLICY needs from
its first step to the final one, over the faulted run's wall time.
"""

from __future__ import annotations

from collections import defaultdict

from bench.trainer_log import process_start, restore_end, trainer_events

CATEGORIES = (
    "productive",
    "startup",
    "restore",
    "compile",
    "checkpoint save",
    "lost progress",
    "recovery / infra",
    "other",
)
STEPPING = {"training", "saving", "preempted", "done"}


def segments(status: list[dict], worker: int = 0, source: str = "job") -> list[list[dict]]:
    """One list of status samples per trainer process (pid), in time order."""
    out: list[list[dict]] = []
    for s in status:
        if s["worker"] != worker or s["source"] != source:
            continue
        if not out or out[-1][-1]["pid"] != s["pid"]:
            out.append([])
        out[-1].append(s)
    return out


def restore_point(seg: list[dict]) -> int | None | str:
    known = [s for s in seg if s["state"] not in ("initializing", "restoring", "failed")]
    return known[0]["restored_from"] if known else "unknown"


def first_stepping(segs: list[list[dict]]) -> float | None:
    return next((s["heartbeat"] for seg in segs for s in seg if s["state"] in STEPPING), None)


def breakdown(record, start: float, end: float, source: str = "job") -> dict[str, float]:
    """Seconds per category over [start, end]; they add up to end - start."""
    segs = segments(record.sampled.get("status", []), source=source)
    lines = record.sampled.get("lines", [])
    out: dict[str, float] = defaultdict(float)

    def add(category: str, a: float | None, b: float | None) -> None:
        if a is not None and b is not None:
            out[category] += max(0.0, min(b, end) - max(a, start))

    previous_end: float | None = None
    for i, seg in enumerate(segs):
        later = [r for r in map(restore_point, segs[i + 1 :]) if r != "unknown"]
        kept = (later[0] or 0) if later else None  # steps past it were lost
        lo = segs[i - 1][-1]["t"] if i else start - 3600
        log = trainer_events(lines, lo, seg[-1]["t"] + 1, seg[0]["pid"], seg[0]["heartbeat"])
        started = log.get("started", {}).get("json", {})
        proc = process_start(log) or started.get("time") or seg[0]["heartbeat"]
        setup = log.get("setup", {}).get("json", {}).get("time")
        compiling = (restore_end(seg, log) or {}).get("heartbeat")
        stepping = [s for s in seg if s["state"] in STEPPING]
        first = stepping[0]["heartbeat"] if stepping else None
        add("recovery / infra", previous_end, proc)
        add("startup", proc, setup or compiling or first)
        add("restore", setup, compiling)
        add("compile", compiling or setup, first)
        productive_before = out["productive"]
        for a, b in zip(stepping, stepping[1:], strict=False):
            if a["state"] in ("saving", "preempted"):
                add("checkpoint save", a["heartbeat"], b["heartbeat"])
            elif kept is not None and b["step"] > kept:
                add("lost progress", a["heartbeat"], b["heartbeat"])
            else:
                add("productive", a["heartbeat"], b["heartbeat"])
        # the local tier's saves, inside steps sampled as productive: the last count reported
        local = max((s.get("local_save_s") or 0.0 for s in stepping), default=0.0)
        moved = min(local, out["productive"] - productive_before)
        out["productive"] -= moved
        out["checkpoint save"] += moved
        previous_end = seg[-1]["heartbeat"]
    probes = [x["json"] for x in lines if x.get("json", {}).get("event") == "peak_measured"]
    probe_s = min(sum(p.get("seconds", 0.0) for p in probes), out["productive"])
    out["productive"] -= probe_s  # the peak probe runs between two steps: not productive
    out["other"] = max(0.0, (end - start) - sum(v for k, v in out.items() if k != "other"))
    return {k: round(out.get(k, 0.0), 3) for k in CATEGORIES}


def reference_span(record, source: str) -> tuple[float, float] | None:
    """A reference run's first step and its `done`, by its own heartbeats."""
    segs = segments(record.sampled.get("status", []), source=source)
    first = first_stepping(segs)
    done = next((s["heartbeat"] for seg in segs for s in seg if s["state"] == "done"), None)
    return None if first is None or done is None else (first, done)


def reference_stepping(record, source: str) -> float | None:
    """A reference run's first step -> done."""
    span = reference_span(record, source)
    return span[1] - span[0] if span else None


def reference_breakdown(record, source: str) -> dict[str, float] | None:
    """A reference run's own categories over its first step -> done (its save stalls above all)."""
    span = reference_span(record, source)
    return breakdown(record, *span, source) if span else None
