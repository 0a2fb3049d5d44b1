"""Goodput on the local pod: a fixed number of steps with a fault every P seconds (kinds in turn),
then the same job uninterrupted twice: with the job's checkpoint policy, and with no checkpoints.
The references carry the watch's observation load (bench.podrun.observed) as the faulted run does,
so the headline charges the faults, not the watch that shares the pod's 2 cores.

Headline (judged, goal 95 %): the time the uninterrupted reference with the SAME checkpoint policy
needs from its first step to the final one, over the faulted run's wall time (its first step ->
watch `done`). Checkpoint overhead, apart: that reference over the one without checkpoints.
The badput breakdown (bench.badput: ml-goodput-measurement's categories) splits the faulted run's
wall time; time a trainer waits on a save is badput there, never productive.

    uv run python -m bench goodput --period 300 --steps 28000

(The 2026-11-22 run stepped `tiny` at about 23 steps/s on the pod's 2 cores: 28000 steps keep the
faulted run past the goal's 20 minutes; each of the two references takes nearly as long.)
"""

from __future__ import annotations

from pathlib import Path

from bench import timeline
from bench.badput import (
    CATEGORIES,
    STEPPING,
    breakdown,
    first_stepping,
    reference_breakdown,
    reference_stepping,
    segments,
)
from bench.checkpoint_bench import OVERHEAD_GOAL, policy_every
from bench.podrun import RunRecord, run_on_pod
from bench.recovery_bench import HANG_S, checkpoint_interval, incidents
from bench.recovery_bench import figures as recovery_figures
from bench.report import Figure

# bench.faults kind -> bench.timeline mark
MARK = {"notice": "preempt", "kill": "kill", "crash": "crash", "hang": "hang"}


def mix_text(kinds: list[str]) -> str:
    """The faults a run had, by kind in first-seen order: "2 notice, 1 crash"."""
    return ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))


def mean_step_time(segs: list[list[dict]]) -> float | None:
    """Stepping time over steps run (lost ones included), saves included, notice saves not."""
    dt = dsteps = 0.0
    for seg in segs:
        stepping = [s for s in seg if s["state"] in STEPPING and s["state"] != "preempted"]
        if len(stepping) > 1:
            dt += stepping[-1]["heartbeat"] - stepping[0]["heartbeat"]
            dsteps += stepping[-1]["step"] - stepping[0]["step"]
    return dt / dsteps if dsteps else None


def own_rate_goodput(badput: dict, wall: float, ref_badput: dict | None) -> float | None:
    """The faults' cost at the faulted run's own step rate: productive time plus the save stalls
    its reference had as well (periodic saves, not the faults'), over its wall. The headline
    compares two runs, so it carries their step rates' run-to-run spread (a few percent on 2
    shared cores); this figure does not, and neither flatters slow stepping: a save stall beyond
    the reference's is badput here."""
    if ref_badput is None:
        return None
    shared_saves = min(badput["checkpoint save"], ref_badput["checkpoint save"])
    return (badput["productive"] + shared_saves) / wall


def probe_seconds(lines: list[dict]) -> float:
    """Time worker 0's trainers spent on the peak probe (`peak_measured`), mid-stepping."""
    probes = [x["json"] for x in lines if x.get("json", {}).get("event") == "peak_measured"]
    return sum(p.get("seconds", 0.0) for p in probes)


def analyse(record: RunRecord) -> dict:
    events = record.events
    segs = segments(record.sampled.get("status", []))
    first = first_stepping(segs)
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
    badput = breakdown(record, first, done)
    ref = reference_stepping(record, "reference")
    ref_bad = reference_breakdown(record, "reference")
    ref_none = reference_stepping(record, "reference-none")
    fp = (record.summary or {}).get("params_fingerprint")
    ref_fp = (record.reference or {}).get("params_fingerprint")
    none_fp = ((record.references.get("reference-none") or {}).get("summary") or {}).get(
        "params_fingerprint"
    )
    return {
        **result,
        "wall_s": wall,
        "wall_incl_first_boot_s": done - record.started,
        "badput_s": badput,
        "productive_s": badput["productive"],
        "goodput_google": badput["productive"] / wall,
        "peak_probe_s": probe_seconds(record.sampled.get("lines", [])),
        "reference_stepping_s": ref,
        "reference_none_stepping_s": ref_none,
        "goodput": ref / wall if ref else None,
        "reference_save_s": (ref_bad or {}).get("checkpoint save"),
        "goodput_own_rate": own_rate_goodput(badput, wall, ref_bad),
        "reference_step_s": ref / final_step if ref and final_step else None,
        "why": None if ref else "no uninterrupted reference with the same policy finished",
        "checkpoint_overhead": ref / ref_none if ref and ref_none else None,
        "fingerprint": fp,
        "reference_fingerprint": ref_fp,
        "reference_none_fingerprint": none_fp,
        "fingerprint_equal": bool(fp and ref_fp and fp == ref_fp),
    }


def plot(record: RunRecord, out: Path, title: str, badput: dict | None = None) -> Path:
    """Step of worker 0 against wall time (a gap per restart) with the faults and recoveries."""
    samples: list[tuple[float, int | None]] = []
    for seg in segments(record.sampled.get("status", [])):  # worker 0's trainers
        if samples and seg[0]["heartbeat"]:
            samples.append((seg[0]["heartbeat"], None))
        samples.extend((s["heartbeat"], s["step"]) for s in seg if s["state"] in STEPPING)
    marks = [{"event": MARK.get(f["kind"], f["kind"]), "time": f["time"]} for f in record.injected]
    marks += [e for e in record.events if e["event"] in ("detected", "resumed")]
    return timeline.plot(samples, marks, out, title, badput=badput)


def run(
    out_dir: Path,
    png: Path,
    period: float = 300.0,
    steps: int = 6000,
    kinds: tuple[str, ...] = ("notice", "kill", "crash", "hang"),
    preset: str = "tiny",
    notice: float = 30.0,
    sets: tuple[str, ...] = (),
    console=None,
) -> dict:
    args = " ".join([f"--config {preset} --steps {steps}", *(f"--set {s}" for s in sets)])
    schedule = {"kinds": list(kinds), "period": period, "cycle": True}
    record = run_on_pod(out_dir / "pod-goodput", args, schedule, notice=notice, reference=True,
                        console=console, hang=HANG_S)  # fmt: skip
    record.save(out_dir / "goodput-run.json")
    return report_run(record, png, period)


def report_run(record: RunRecord, png: Path, period: float) -> dict:
    """Analysis and timeline of a finished run (also for a saved one: `--record`)."""
    result = analyse(record)
    result["period_s"] = period
    if result.get("goodput") is not None:
        minutes = result["wall_s"] / 60
        title = f"{record.trainer_args}: a fault every {period:g} s ({minutes:.1f} min)"
        result["timeline"] = str(plot(record, png, title, result["badput_s"]))
    return result


def figures(result: dict) -> list[Figure]:
    """Headline, badput table, checkpoint overhead, fingerprint; then the run's recovery rows."""
    period = result.get("period_s", 0)
    recovery = recovery_figures(result, where=f"goodput run, P={period:g} s")
    if result.get("goodput") is None:
        why = result.get("why") or result.get("outcome")
        return [Figure("goodput", f"not measured: {why}"), *recovery]
    wall, kinds = result["wall_s"], result["kinds"]
    mix = mix_text(kinds)
    where = f"P={period:g} s, {wall / 60:.1f} min, {len(kinds)} faults: {mix}"
    conditions = period <= 300 and wall >= 1200 and len(set(kinds)) > 1
    g, own = result["goodput"], result.get("goodput_own_rate")
    ref_step, job_step = result.get("reference_step_s"), result.get("mean_step_time_s")
    noise = ""
    if g > 1 and ref_step and job_step:
        noise = (
            f"; over 100%: the faulted run stepped faster than its reference ({job_step * 1e3:.1f}"
            f" vs {ref_step * 1e3:.1f} ms a step, saves included), so the two runs' step rates "
            "differ by more than the faults cost"
        )
    figs = [
        Figure(
            f"goodput: reference with the same checkpoint policy / faulted wall ({where})",
            f"{g:.1%}",
            n=1,
            goal=">= 95% (a fault per 5 min, >= 20 min, mixed kinds)",
            met=g >= 0.95 and conditions and own is not None and own >= 0.95,
            note=f"reference stepped {result['reference_stepping_s']:.0f} s to step "
            f"{result['final_step']}, faulted run {wall:.0f} s (first step -> done)"
            + ("" if conditions else "; this run is shorter or sparser than the goal's: not met")
            + noise
            + f"; met only if the own-rate figure below is too; references observed as the "
            f"watch observes (describe + probe every poll); job: {result['trainer_args']}",
        )
    ]
    if own is not None:
        figs.append(
            Figure(
                f"goodput at the faulted run's own step rate ({where})",
                f"{own:.1%}",
                n=1,
                goal=">= 95%",
                met=own >= 0.95 and conditions,
                note="(productive + the save stalls its reference had too) / wall: the faults' "
                "cost without the two runs' step-rate spread; reference's save stalls "
                f"{result['reference_save_s']:.0f} s, the faulted run's "
                f"{result['badput_s']['checkpoint save']:.0f} s",
            )
        )
    bad = result["badput_s"]
    table = ", ".join(f"{k} {bad[k]:.0f} s ({bad[k] / wall:.1%})" for k in CATEGORIES)
    biggest = max((k for k in CATEGORIES if k != "productive"), key=lambda k: bad[k])
    figs.append(
        Figure(
            f"badput breakdown ({where})",
            table,
            n=len(kinds),
            note=f"ml-goodput-measurement categories over the faulted run's wall time, worker 0's "
            f"trainers (bench/badput.py); Google's goodput (productive / wall) "
            f"{result['goodput_google']:.1%}; largest badput: {biggest}",
        )
    )
    overhead = result.get("checkpoint_overhead")
    preset = (result["trainer_args"].split("--config ")[1:] or ["?"])[0].split()[0]
    interval = checkpoint_interval(result["trainer_args"])
    # The goal holds at its own policy only (bench.checkpoint_bench.policy_every), and is judged
    # by `bench overhead`: these two references ran one after the other, each once, and whole
    # runs minutes apart differ in speed by as much as the goal allows.
    limit = OVERHEAD_GOAL.get(preset) if (interval or 0) == policy_every(preset) else None
    judged = f"; the goal (<= {limit}) is judged by `bench overhead` (interleaved rounds)"
    figs.append(
        Figure(
            f"checkpoint overhead, {preset} every {interval or 'preset'} steps (pod, goodput run)",
            overhead if overhead is not None else "not measured: a reference did not finish",
            "x" if overhead is not None else "",
            n=1,
            note=f"uninterrupted reference with that policy {result['reference_stepping_s']:.0f} s "
            f"/ without checkpoints {result['reference_none_stepping_s'] or 0:.0f} s, first step "
            f"-> done, one run each{judged if limit else ''}",
        )
    )
    equal = result["fingerprint_equal"]
    figs.append(
        Figure(
            f"final params fingerprint equals the uninterrupted run ({where})",
            "yes"
            if equal
            else f"no ({result['fingerprint']} vs {result['reference_fingerprint']})",
            n=1,
            goal="yes",
            met=equal,
        )
    )
    return figs + recovery
