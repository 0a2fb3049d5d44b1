"""`python -m bench --smoke`: the whole reporting path in seconds, without a pod or a trainer.

A synthetic run record (two workers, a preemption with notice and a no-notice kill) goes through
the same analyses, timeline and report writer as a real run. Its figures are labelled synthetic
and go to bench/out/smoke/, never to the committed BENCHMARKS.md.
"""

from __future__ import annotations

from bench.podrun import RunRecord

T0 = 1_700_000_000.0
STEP_S = 0.1
SAVE_EVERY, SAVE_S = 50, 0.4  # the loop blocks SAVE_S on each periodic save


def _segment(
    pid: int,
    start: float,
    first: int,
    last: int,
    restored: int | None,
    end_state: str,
    source: str = "job",
    save_every: int = SAVE_EVERY,
):
    """Status samples of one trainer process on both workers: init, compile, steps (a `saving`
    sample and SAVE_S more at every save), end."""
    out = []
    for w in (0, 1):
        base = {
            "worker": w,
            "source": source,
            "pid": pid + w,
            "exit_code": None,
            "compile_cache_hit": False,
            "restored_from": restored,
        }
        out.append({**base, "t": start, "heartbeat": start, "state": "initializing", "step": 0})
        out.append(
            {**base, "t": start + 3, "heartbeat": start + 3, "state": "compiling", "step": first}
        )
        out.append(
            {**base, "t": start + 5, "heartbeat": start + 5, "state": "training", "step": first}
        )
        t = start + 5
        for s in range(first + 1, last + 1):
            t += STEP_S
            state = end_state if s == last else "training"
            out.append({**base, "t": t, "heartbeat": t, "state": state, "step": s})
            if save_every and s % save_every == 0 and s != last:
                out.append({**base, "t": t + 0.01, "heartbeat": t + 0.01, "state": "saving",
                            "step": s})  # fmt: skip
                t += SAVE_S
    return sorted(out, key=lambda x: (x["t"], x["worker"]))


def _startup_lines(start: float, pid: int) -> list[dict]:
    """Worker 0's start-up events around its first status at `start`: {"t": seen, "json": event}."""
    events = [
        ("started", start - 0.2, {"process_start": start - 0.4, "pid": pid}),
        ("jax_initialized", start + 1.5, {"seconds": 0.5}),
        ("setup", start + 1.9, {}),
        ("compiled", start + 4.5, {"seconds": 1.5, "compile_cache_hit": False}),
    ]
    return [
        {"t": t + 0.1, "json": {"event": name, "time": t, **fields}} for name, t, fields in events
    ]


def record(steps: int = 300) -> RunRecord:
    """Faults at steps 100 (notice: saved at 100) and 200 (kill: last checkpoint 195)."""
    a = _segment(100, T0, 0, 100, None, "preempted")
    t1 = a[-1]["t"]
    b = _segment(200, t1 + 12, 100, 200, 100, "training")
    t2 = b[-1]["t"]
    c = _segment(300, t2 + 10, 195, steps, 195, "done")
    done = c[-1]["t"] + 0.5
    injected = [
        {"time": t1 - 2.0, "kind": "notice", "notice": 30.0, "step": 99},
        {"time": t2 + 0.05, "kind": "kill", "notice": 0.0, "step": 200},
    ]
    events = [{"time": T0 - 1, "event": "watching"}]
    for fault, resume_at, restored in ((injected[0], t1 + 18, 100), (injected[1], t2 + 16, 195)):
        t = fault["time"]
        events += [
            {"time": t + 0.6, "event": "detected", "kind": "preemption"},
            {"time": t + 3, "event": "recreated", "seconds": 1.0},
            {"time": t + 6, "event": "ready", "seconds": 4.0},
            {"time": t + 9, "event": "bootstrapped", "seconds": 7.0},
            {"time": resume_at, "event": "resumed", "step": restored, "recovery_s": 9.0},
        ]
    events.append({"time": done, "event": "done", "step": steps})
    boots = [
        {
            "worker": w,
            "started": t + 6.2,
            "updated": t + 8.5,
            "phases": [
                {"name": "metadata", "started": t + 6.2, "ended": t + 6.5},
                {"name": "start-trainer", "started": t + 8.0, "ended": t + 8.5},
            ],
        }
        for f in injected
        for t in [f["time"]]
        for w in (0, 1)
    ]
    lines = [line for seg in (b, c) for line in _startup_lines(seg[0]["t"], seg[0]["pid"])]
    # The uninterrupted references, after the run: with the same checkpoint policy, and none.
    ref = _segment(900, done + 5, 0, steps, None, "done", source="reference")
    ref_none = _segment(950, ref[-1]["t"] + 5, 0, steps, None, "done", "reference-none", 0)
    fp = "synthetic-fingerprint"
    return RunRecord(
        trainer_args=f"--config tiny --steps {steps}",
        workers=2,
        started=T0 - 30,
        ready=T0 - 5,
        finished=done,
        exit="done",
        events=events,
        injected=injected,
        sampled={
            "status": a + b + c + ref + ref_none,
            "boots": boots,
            "lines": sorted(lines, key=lambda x: x["t"]),
        },
        summary={"final_step": steps, "params_fingerprint": fp},
        reference={"final_step": steps, "params_fingerprint": fp},
        references={"reference-none": {"summary": {"params_fingerprint": fp}, "wall_s": 40.0}},
    )
