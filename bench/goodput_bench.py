"""Goodput on the local pod: a fixed number of steps with a fault every P seconds (preemptions
with notice and no-notice kills in turn), then the same job uninterrupted for the fingerprint.

productive time = the time each trainer process spent stepping towards steps that were kept (its
first step -> the step the next process restored from; the trainer's own heartbeat stamps;
periodic saves included, compile, restarts, lost steps and peak probes not: a trainer without a
cached peak probes it after its first step); wall time = the first training step seen -> watch
`done`. final step x mean step time is kept beside it as a cross-check.

    uv run python -m bench goodput --period 300 --steps 6000
"""

from __future__ import annotations

from pathlib import Path

from bench import timeline
from bench.podrun import RunRecord, run_on_pod
from bench.recovery_bench import figures as recovery_figures
from bench.recovery_bench import incidents
from bench.report import Figure

STEPPING = {"training", "saving", "preempted", "done"}
# bench.faults kind -> bench.timeline mark
MARK = {"notice": "preempt", "kill": "kill", "crash": "crash"}


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


def mean_step_time(segs: list[list[dict]]) -> float | None:
    """Stepping time over steps run (lost ones included), saves included, notice saves not."""
    dt = dsteps = 0.0
    for seg in segs:
        stepping = [s for s in seg if s["state"] in STEPPING and s["state"] != "preempted"]
        if len(stepping) > 1:
            dt += stepping[-1]["heartbeat"] - stepping[0]["heartbeat"]
            dsteps += stepping[-1]["step"] - stepping[0]["step"]
    return dt / dsteps if dsteps else None


def _restore_point(seg: list[dict]) -> int | None | str:
    known = [s for s in seg if s["state"] not in ("initializing", "failed")]
    return known[0]["restored_from"] if known else "unknown"


def productive_time(segs: list[list[dict]]) -> float:
    """Sum over trainer processes of the time spent stepping towards steps that were kept: from
    its first step to the step the next process restored from (the last process: to its end)."""
    total = 0.0
    for i, seg in enumerate(segs):
        stepping = [s for s in seg if s["state"] in STEPPING and s["state"] != "preempted"]
        if not stepping:
            continue
        end = stepping[-1]["heartbeat"]
        later = [r for r in map(_restore_point, segs[i + 1 :]) if r != "unknown"]
        if later:
            kept = later[0] or 0
            end = next((s["heartbeat"] for s in stepping if s["step"] >= kept), end)
        total += max(0.0, end - stepping[0]["heartbeat"])
    return total


def probe_seconds(lines: list[dict]) -> float:
    """Time worker 0's trainers spent on the peak probe (`peak_measured`), mid-stepping."""
    probes = [x["json"] for x in lines if x.get("json", {}).get("event") == "peak_measured"]
    return sum(p.get("seconds", 0.0) for p in probes)


def analyse(record: RunRecord) -> dict:
    events = record.events
    segs = segments(record.sampled.get("status", []))
    first = next((s["heartbeat"] for seg in segs for s in seg if s["state"] in STEPPING), None)
    done = next((e["time"] for e in events if e["event"] == "done"), None)
    step_time = mean_step_time(segs)
    final_step = (record.summary or {}).get("final_step")
    result: dict = {
        "trainer_args": record.trainer_args,
        "outcome": record.exit,
        "events": len(record.injected),
        "kinds": [f["kind"] for f in record.injected],
        "final_step": final_step,
        "mean_step_time_s": step_time,
        "incidents": incidents(record),
    }
    if None in (first, done, step_time, final_step):
        return {**result, "goodput": None, "why": "run did not finish or no steps sampled"}
    wall = done - first
    probes = probe_seconds(record.sampled.get("lines", []))
    productive = productive_time(segs) - probes
    ref_segs = segments(record.sampled.get("status", []), source="reference")
    ref_first = next(
        (s["heartbeat"] for seg in ref_segs for s in seg if s["state"] in STEPPING), None
    )
    ref_done = next((s["heartbeat"] for seg in ref_segs for s in seg if s["state"] == "done"), None)
    fp = (record.summary or {}).get("params_fingerprint")
    ref_fp = (record.reference or {}).get("params_fingerprint")
    return {
        **result,
        "wall_s": wall,
        "wall_incl_first_boot_s": done - record.started,
        "productive_s": productive,
        "peak_probe_s": probes,
        "productive_steps_x_mean_s": final_step * step_time,
        "goodput": productive / wall,
        "reference_stepping_s": ref_done - ref_first if ref_first and ref_done else None,
        "fingerprint": fp,
        "reference_fingerprint": ref_fp,
        "fingerprint_equal": bool(fp and ref_fp and fp == ref_fp),
    }


def plot(record: RunRecord, out: Path, title: str) -> Path:
    """Step of worker 0 against wall time (a gap per restart) with the faults and recoveries."""
    samples: list[tuple[float, int | None]] = []
    for seg in segments(record.sampled.get("status", [])):
        if samples and seg[0]["heartbeat"]:
            samples.append((seg[0]["heartbeat"], None))
        samples.extend((s["heartbeat"], s["step"]) for s in seg if s["state"] in STEPPING)
    marks = [{"event": MARK.get(f["kind"], f["kind"]), "time": f["time"]} for f in record.injected]
    marks += [e for e in record.events if e["event"] in ("detected", "resumed")]
    return timeline.plot(samples, marks, out, title)


def run(
    out_dir: Path,
    png: Path,
    period: float = 300.0,
    steps: int = 6000,
    kinds: tuple[str, ...] = ("notice", "kill"),
    preset: str = "tiny",
    notice: float = 30.0,
    sets: tuple[str, ...] = (),
    console=None,
) -> dict:
    args = " ".join([f"--config {preset} --steps {steps}", *(f"--set {s}" for s in sets)])
    schedule = {"kinds": list(kinds), "period": period, "cycle": True}
    record = run_on_pod(
        out_dir / "pod-goodput", args, schedule, notice=notice, reference=True, console=console
    )
    record.save(out_dir / "goodput-run.json")
    return report_run(record, png, period)


def report_run(record: RunRecord, png: Path, period: float) -> dict:
    """Analysis and timeline of a finished run (also for a saved one: `--record`)."""
    result = analyse(record)
    result["period_s"] = period
    if result.get("goodput") is not None:
        minutes = result["wall_s"] / 60
        title = f"{record.trainer_args}: a fault every {period:g} s ({minutes:.1f} min)"
        result["timeline"] = str(plot(record, png, title))
    return result


def figures(result: dict) -> list[Figure]:
    """The goodput rows, plus the recovery rows of the run's own events."""
    period = result.get("period_s", 0)
    recovery = recovery_figures(result, where=f"goodput run, P={period:g} s")
    if result.get("goodput") is None:
        why = result.get("why", result.get("outcome"))
        return [Figure(f"goodput (P={period:g} s)", f"not measured: {why}"), *recovery]
    minutes = result["wall_s"] / 60
    kinds = result["kinds"]
    name = (
        f"goodput (P={period:g} s, {minutes:.1f} min run, {len(kinds)} events: "
        f"{kinds.count('notice')} with notice, {len(kinds) - kinds.count('notice')} without)"
    )
    goal = ">= 95% at P = 300 s"
    met = result["goodput"] >= 0.95 if period == 300 else None
    note = (
        f"productive {result['productive_s']:.0f} s (stepping towards kept steps; "
        f"{result['final_step']} steps x mean {result['mean_step_time_s']:.3f} s = "
        f"{result['productive_steps_x_mean_s']:.0f} s) over wall {result['wall_s']:.0f} s "
        f"(first step -> done); job: {result['trainer_args']}"
    )
    if result.get("peak_probe_s"):
        note += f"; peak probes ({result['peak_probe_s']:.1f} s) not counted as productive"
    if result.get("reference_stepping_s"):
        note += f"; uninterrupted reference stepped {result['reference_stepping_s']:.0f} s"
    figs = [Figure(name, f"{result['goodput']:.1%}", "", goal, met, note=note)]
    lost = {k: [i["steps_lost"] for i in result["incidents"] if i["kind"] == k] for k in set(kinds)}
    text = "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in sorted(lost.items()))
    notice_ok = all(x == 0 for x in lost.get("notice", []))
    figs.append(
        Figure(
            f"steps lost per event (goodput run, P={period:g} s)",
            text,
            "",
            "0 with notice",
            notice_ok if "notice" in lost else None,
        )
    )
    equal = result["fingerprint_equal"]
    figs.append(
        Figure(
            "final params fingerprint equals the uninterrupted run",
            "yes"
            if equal
            else f"no ({result['fingerprint']} vs {result['reference_fingerprint']})",
            "",
            "yes",
            equal,
        )
    )
    return figs + recovery
