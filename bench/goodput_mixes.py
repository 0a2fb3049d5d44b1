"""Goodput by Google's definition (productive time / wall, ml-goodput-measurement's categories:
bench/badput.py), per fault mix, judged on the median of >= 3 runs (issue 50). Each round is one
faulted pod run of the built-in trainer (`tiny`, saves to the bucket every 100 steps and to each
worker's local tier every 50: MIX_SETS) with a fault every --period seconds, the mix's kinds in
turn, from its first step to watch `done`; a round shorter than 20 minutes or sparser than a fault per 5 minutes is
recorded and marked so. Google's figure needs no reference, so the rounds run none; the last
round's pod then runs the uninterrupted job once, and every round's final params are compared to
it bitwise (the same job and steps: one reference serves them all; `--no-reference` skips it,
and the row then says only whether the runs agree with each other).

- `goodput-survive`: faults the VMs survive, a crash and a hang in turn (restarts on the same
  VMs, from each worker's local tier). `tpupod restart` and rollouts take the same path but are
  an operator's doing, not faults: not injected.
- `goodput-pinned`: the pinned mix, 2 notices, 2 kills, a crash and a hang in every 6 faults: a
  run holds the whole mix only when it lasts >= 30 minutes at a fault per 5 minutes.

`--steps` sets a run's length: `tiny`'s step took ~52 ms on the 2-core machines of 2026-12-04/05
(26000 steps: ~23 min; 36000: ~33 min) and 90-95 ms on earlier sessions' (14000-20000); each
run's minutes, faults and step time are in its row.

    uv run python -m bench goodput-survive --runs 3 --steps 26000  # with the reference: ~1.6 h
    uv run python -m bench goodput-pinned --runs 3 --steps 36000 --no-reference  # ~1.7 h
"""

from __future__ import annotations

from pathlib import Path

from bench.badput import CATEGORIES
from bench.goodput_bench import analyse, mix_text
from bench.podrun import run_on_pod
from bench.recovery_bench import HANG_S
from bench.recovery_bench import figures as recovery_figures
from bench.report import Figure, median, spread

MIXES: dict[str, tuple[str, ...]] = {
    "goodput-survive": ("crash", "hang"),
    "goodput-pinned": ("notice", "kill", "crash", "notice", "kill", "hang"),
}
LABELS = {"goodput-survive": "faults the VMs survive", "goodput-pinned": "pinned mix"}
GOAL_MINUTES, GOAL_PERIOD_S = 20.0, 300.0
# The job's checkpoint policy (--set adds to it, a key given again wins): the bucket every 100
# steps as the goodput run had it, the local tier every 50. A local save costs ~26 ms of `tiny`'s
# ~24 ms step (600 steps in one process: every 2 steps 22.6 s, every 10 15.9, every 25 15.1, none
# 14.7), and Google's goodput counts a slowed step as productive, so the interval is chosen by
# Young and Daly's rule, sqrt(2 x save cost x time between faults) ~ 4 s of steps here, rounded
# down to half the bucket's interval: every restart then reads a local copy at or past the
# bucket's newest step.
MIX_SETS = ("checkpoint_every=100", "local_checkpoint_every=50")


def run(bench: str, out_dir: Path, rounds: int, period: float, steps: int, preset: str,
        notice: float, sets: tuple[str, ...], console=None, reference: bool = True) -> dict:  # fmt: skip
    args = " ".join(
        [f"--config {preset} --steps {steps}", *(f"--set {s}" for s in MIX_SETS + sets)]
    )
    schedule = {"kinds": list(MIXES[bench]), "period": period, "cycle": True}
    results, ref_print = [], None
    for i in range(rounds):
        last = reference and i == rounds - 1
        if console is not None:
            console.print(f"{bench}: round {i + 1} of {rounds} ({args})")
        record = run_on_pod(out_dir / f"pod-{bench}", args, schedule, notice=notice,
                            reference=last, references=(), console=console, hang=HANG_S)  # fmt: skip
        record.save(out_dir / f"{bench}-round-{i + 1}.json")
        results.append(analyse(record))
        if last:
            ref_print = (record.reference or {}).get("params_fingerprint")
    return {"bench": bench, "kinds": list(MIXES[bench]), "period_s": period,
            "trainer_args": args, "rounds": results, "reference_fingerprint": ref_print}  # fmt: skip


def figures(result: dict) -> list[Figure]:
    """Google's goodput (the median round), the median badput breakdown, the fingerprints,
    then recovery rows over every round's faults."""
    bench, period = result["bench"], result["period_s"]
    done = [r for r in result["rounds"] if r.get("wall_s") and r.get("productive_s") is not None]
    where = f"{', '.join(dict.fromkeys(result['kinds']))}; P={period:g} s, {len(done)} runs"
    name = f"goodput, {LABELS[bench]} ({where}): productive / wall, Google's definition"
    failed = len(result["rounds"]) - len(done)
    if not done:
        return [Figure(name, "not measured: no round finished")]
    values = [100 * r["productive_s"] / r["wall_s"] for r in done]
    short = [r for r in done if r["wall_s"] < 60 * GOAL_MINUTES]
    conditions = ""
    if short or period > GOAL_PERIOD_S:
        conditions = (
            f"; shorter or sparser than the goal's: {len(short)} run(s) under "
            f"{GOAL_MINUTES:g} min, a fault every {period:g} s"
        )
    # Google's productive time counts slow steps as productive: each run's step time (saves,
    # both tiers, included) says what the checkpoints cost the steps themselves.
    rounds_text = "; ".join(
        f"{r['wall_s'] / 60:.1f} min, {len(r['kinds'])} faults ({mix_text(r['kinds'])}), "
        f"{1e3 * (r.get('mean_step_time_s') or 0):.0f} ms a step"
        for r in done
    )
    figs = [
        Figure(name, f"{median(values):.1f} %", n=len(done), spread=spread(values, "%"),
               note=f"median of the runs; each: {rounds_text}"
               + (f"; {failed} run(s) did not finish" if failed else "")
               + conditions + f"; job: {result['trainer_args']}")
    ]  # fmt: skip
    bad = {k: median([r["badput_s"][k] for r in done]) for k in CATEGORIES}
    wall = median([r["wall_s"] for r in done])
    table = ", ".join(f"{k} {bad[k]:.0f} s ({bad[k] / wall:.1%})" for k in CATEGORIES)
    biggest = max((k for k in CATEGORIES if k != "productive"), key=lambda k: bad[k])
    figs.append(Figure(f"badput breakdown, {LABELS[bench]} ({where}), medians", table,
                       n=len(done), note="each category's median over the runs, against the "
                       f"median wall ({wall:.0f} s); largest badput: {biggest}"))  # fmt: skip
    ref = result.get("reference_fingerprint")
    equal = [bool(ref) and r.get("fingerprint") == ref for r in done]
    prints = {r.get("fingerprint") for r in done}
    agree = (
        "every run's final params are the same"
        if len(prints) == 1 and None not in prints
        else f"the runs' final params differ ({len(prints)} fingerprints)"
    )
    figs.append(
        Figure(f"final params fingerprint equals the uninterrupted run, every run ({where})",
               "yes" if equal and all(equal) else ("not measured: no reference finished"
               if not ref else f"no ({equal.count(False)} of {len(done)} differ)"),
               n=len(done), goal="yes", met=bool(equal) and all(equal), note=agree)
    )  # fmt: skip
    incidents = [i for r in done for i in r.get("incidents", [])]
    every = {"trainer_args": result["trainer_args"], "incidents": incidents}
    return figs + recovery_figures(every, where=f"{bench} runs, P={period:g} s")
