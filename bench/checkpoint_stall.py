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


def stall_figure(r: dict):
    from bench.report import Figure

    name = "save stall while the previous save writes (tiny, a save due every step)"
    if r["exit_code"] != 0 or r["waited_behind_s"] is None or not r["step_s"]:
        return Figure(name, f"not measured: the run exited {r['exit_code']}")
    step = r["step_s"]
    return Figure(
        name,
        r["waited_behind_s"],
        "s",
        f"<= one step ({step * 1e3:.0f} ms, the run's median)",
        r["waited_behind_s"] <= step,
        note=f"policy: coalesce (a save due while the previous writes is deferred to the first "
        f"step after the write); {r['saves_deferred']} of {r['steps']} saves deferred; value: the "
        f"longest save() that found the previous one still writing (0: none did); the longest "
        f"step {r['longest_step_s'] * 1e3:.0f} ms (a save's own start included); one process "
        f"on the pod's GCS emulator (OCDBT), {' '.join(SETS)}",
    )
