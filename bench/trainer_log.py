"""Worker 0's job.log as the sampler kept it ({"t": seen, "json": line}): the events of one
trainer process and its start-up milestones, by the trainer's own clock (its lines' `time`).

A trainer from before those times falls back to when the sampler saw a line (0.2 s poll).
"""

from __future__ import annotations


def stamp(line: dict) -> float:
    """A log line's own `time`, else when the sampler first saw it (a trainer without times)."""
    return line["json"].get("time", line["t"])


def trainer_events(lines: list[dict], t0: float, t1: float, pid: int, up: float) -> dict:
    """The first event of each name logged by trainer process `pid` between t0 and t1: the lines
    from its `started` on (without one: the lines seen after its first status, `up`)."""
    inside = [x for x in lines if t0 < x["t"] < t1]
    window = [x for x in inside if "event" in x.get("json", {})]
    mine = [
        i
        for i, x in enumerate(window)
        if x["json"]["event"] == "started" and x["json"].get("pid") == pid
    ]
    window = window[mine[0] :] if mine else [x for x in window if x["t"] >= up]
    found = {x["json"]["event"]: x for x in reversed(window)}
    note = f"promoted the standby (pid {pid})"  # the launcher's, in the attempt's log
    promoted = next((x for x in inside if note in x.get("text", "")), None)
    if promoted is not None:
        found["promoted"] = promoted
    return found


def process_start(log: dict) -> float | None:
    """When this trainer's attempt began: its process's start (/proc), or for a standby (its
    process parked since then) its promotion: the trainer's own `promoted_at`, else (trainers
    before it) when the sampler saw the launcher's note (0.2 s poll)."""
    started = log.get("started", {}).get("json", {})
    if started.get("promoted_at"):
        return started["promoted_at"]
    proc = started.get("process_start")
    if proc is not None and "promoted" in log:
        return max(proc, log["promoted"]["t"])
    return proc


def trainer_milestones(log: dict) -> dict[str, float]:
    """process_start, started, imported (JAX init begins), jax_initialized and setup, as present."""
    m: dict[str, float] = {}
    started, jax_init = log.get("started"), log.get("jax_initialized")
    if started:
        if began := process_start(log):
            m["process_start"] = began
        m["started"] = stamp(started)
    if jax_init:
        m["imported"] = stamp(jax_init) - jax_init["json"].get("seconds", 0.0)
        m["jax_initialized"] = stamp(jax_init)
    if "setup" in log:
        m["setup"] = stamp(log["setup"])
    return m


def restore_end(statuses: list[dict], log: dict) -> dict | None:
    """The status that ends one trainer's restore: its `compiling` ({heartbeat, restored_from,
    restored_tier}). The sampler reads status.json every 0.2 s, and a `compiling` shorter than
    that (the step lowered beside the restore, its cached executable ready) can go unseen: then
    the trainer's own `restored` event says the same, by its own clock."""
    compiling = next((s for s in statuses if s["state"] == "compiling"), None)
    if compiling is None and "restored" in log:
        done = log["restored"]["json"]
        compiling = {"heartbeat": stamp(log["restored"]), "restored_from": done.get("step"),
                     "restored_tier": done.get("tier")}  # fmt: skip
    return compiling
