"""Issue 18's "no stall on a save longer than one step while a previous save is still writing":
`tiny` saving every step on the pod's GCS emulator, where a save (tenths of a second) outlasts
many steps (tens of ms), so nearly every save comes due while the previous one still writes.
The trainer defers such a save to the first step after the write (coalescing all that came due
meanwhile) instead of waiting; it reports how many it deferred and the longest save() that
still found the previous one writing (`save_waited_behind_s` in its `done` line)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.storage_trainer import (
    BUCKET,
    emulator,
    events_in,
    median_step,
    start_trainer,
    step_times,
)

# keep_every=0: a step that retention keeps for good waits for the writer by design (a coalesced
# save would land off its grid), so the case leaves it out; keep_latest=2 keeps the bucket small.
SETS = ["checkpoint_every=1", "keep_latest=2", "keep_every=0"]


def stall_run(steps: int = 60) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "emulator.log"
        with emulator(log) as env:
            wd = f"gs://{BUCKET}/runs/stall"
            proc = start_trainer("tiny", steps, wd, SETS, env, str(Path(tmp) / "cc"))
            out, _ = proc.communicate(timeout=600)
    done = events_in(out).get("done", {})
    times = step_times(out)
    return {
        "steps": steps,
        "exit_code": proc.returncode,
        "saves_deferred": done.get("saves_deferred"),
        "waited_behind_s": done.get("save_waited_behind_s"),
        "step_s": median_step(times),
        "longest_step_s": max(times[1:], default=None),  # the first holds the compile
    }


def stall_figure(runs: list[dict] | dict):
    """One row over the runs: the median of their longest save() behind a writer, judged
    against one median step, met only if every run's is (a run that failed: not measured)."""
    from bench.report import Figure, median, spread

    runs = [runs] if isinstance(runs, dict) else runs
    name = "save stall while the previous save writes (tiny, a save due every step)"
    if bad := [r for r in runs if r["exit_code"] != 0 or r["waited_behind_s"] is None
               or not r["step_s"]]:  # fmt: skip
        return Figure(name, f"not measured: the run exited {bad[0]['exit_code']}")
    waited = [r["waited_behind_s"] for r in runs]
    step = median([r["step_s"] for r in runs])
    deferred = ", ".join(f"{r['saves_deferred']} of {r['steps']}" for r in runs)
    longest = max(r["longest_step_s"] for r in runs)
    return Figure(
        name,
        median(waited),
        "s",
        f"<= one step ({step * 1e3:.0f} ms, the runs' median)",
        all(r["waited_behind_s"] <= r["step_s"] for r in runs),
        note=f"policy: coalesce (a save due while the previous writes is deferred to the first "
        f"step after the write); saves deferred: {deferred}; value: the longest save() that "
        f"found the previous one still writing (0: none did), median of {len(runs)} run(s), met "
        f"only if every run's is within its own median step; the longest step "
        f"{longest * 1e3:.0f} ms (a save's own start included); one process on the pod's GCS "
        f"emulator (OCDBT), {' '.join(SETS)}",
        n=len(runs),
        spread=spread(waited, "s", 3),
    )
