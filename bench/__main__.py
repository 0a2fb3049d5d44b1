"""`uv run python -m bench [all|trainer|checkpoint|recovery|goodput|faults|cost|infra ...]`

Runs the chosen benchmarks, merges their figures into BENCHMARKS.md (each run replaces every row
of its own benchmark and keeps the others'), keeps raw results in bench/out/ and draws the goodput
timeline to docs/goodput-timeline.png. A benchmark that cannot run leaves a "not run: why" row.
`--smoke` runs the reporting path on a synthetic run in seconds (CI) and writes to bench/out/smoke/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path

from rich.console import Console

from bench import report
from bench.report import Figure

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
PNG = REPO / "docs" / "goodput-timeline.png"
# tiny's own cadence (every 5 steps) is a test setting; saves to the GCS emulator take seconds.
GOODPUT_SETS = ("checkpoint_every=100",)
ORDER = ["trainer", "gpu", "checkpoint", "infra", "recovery", "goodput", "faults", "cost"]
NAMED_ONLY = {"faults"}  # hours long: run when named, never by `all`


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[1])
    p.add_argument("which", nargs="*", help=f"all (default) or any of {', '.join(ORDER)}")
    p.add_argument("--smoke", action="store_true", help="synthetic run, seconds, no pod (CI)")
    p.add_argument("--out", type=Path, help="markdown file [BENCHMARKS.md; smoke: bench/out/smoke]")
    p.add_argument("--period", type=float, default=300.0, help="goodput: seconds between faults")
    p.add_argument("--steps", type=int, default=6000, help="goodput: steps of the job")
    p.add_argument(
        "--record",
        type=Path,
        help="recovery/goodput: analyse this saved run (bench/out/*-run.json), run nothing",
    )
    p.add_argument(
        "--faults", default="notice,kill,crash,hang", help="goodput: fault kinds, in turn"
    )
    p.add_argument("--preset", default="tiny", help="recovery/goodput: the pod job's preset")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="recovery/goodput: trainer --set for the pod job; gpu: for `1b` (repeatable) "
        f"[{' '.join(GOODPUT_SETS)}]",
    )
    p.add_argument("--min-steps", type=int, default=30, help="recovery: steps between faults")
    p.add_argument("--notice", type=float, default=30.0, help="preemption notice, seconds")
    p.add_argument("--trainer-config", default="small", help="trainer/checkpoint: preset")
    p.add_argument("--trainer-steps", type=int, default=15)
    p.add_argument("--checkpoint-steps", type=int, default=30)
    p.add_argument(
        "--checkpoint-repeats",
        type=int,
        default=3,
        help="checkpoint: interleaved runs of each variant (none, async, sync)",
    )
    p.add_argument(
        "--checkpoint-pod",
        action="store_true",
        help="checkpoint: overhead on the 2-worker local pod (none, async), not in one process",
    )
    p.add_argument("--count", type=int, default=100, help="faults: how many faults in all")
    p.add_argument("--seed", type=int, default=0, help="faults: seed of the random mix")
    p.add_argument("--per-leg", type=int, default=25, help="faults: faults per pod run (leg)")
    return p


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def measured_at(figs: list[Figure], when: float, what: str) -> list[Figure]:
    """Rows re-analysed from a saved run carry that run's date, not today's load and date."""
    stamp = dt.datetime.fromtimestamp(when, dt.UTC)
    for fig in figs:
        fig.date = stamp.date().isoformat()
        fig.machine = f"{report.this_machine()}, {what} {stamp:%Y-%m-%d %H:%M} UTC"
    return figs


def trainer_figs(a, console) -> list[Figure]:
    from bench import trainer_bench

    r = trainer_bench.run(a.trainer_config, a.trainer_steps)
    save("trainer", r)
    return trainer_bench.figures(r)


def gpu_figs(a, console) -> list[Figure]:
    """`1b` on one GPU: MFU against the datasheet peak (trainer.metrics.PEAK_FLOPS)."""
    import shutil
    import subprocess

    from bench import trainer_bench

    if shutil.which("nvidia-smi") is None:
        return [Figure(trainer_bench.GPU_ROW, "not measured: no GPU on this machine")]
    query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    gpu = subprocess.run(query, capture_output=True, text=True).stdout.strip().splitlines()[0]
    os.environ.setdefault("JAX_PLATFORMS", "cuda")
    r = trainer_bench.run("1b", a.trainer_steps, sets=tuple(a.sets))
    save("gpu", r)
    return trainer_bench.gpu_figures(r, gpu)


def checkpoint_figs(a, console) -> list[Figure]:
    from bench import checkpoint_bench

    r = checkpoint_bench.run(a.trainer_config, a.checkpoint_steps, repeats=a.checkpoint_repeats,
                             pod=a.checkpoint_pod, console=console)  # fmt: skip
    save("checkpoint", r)
    return checkpoint_bench.figures(r) + checkpoint_storage_figs()


def checkpoint_storage_figs() -> list[Figure]:
    """Restore / save-on-notice seconds and steps lost on a kill, on the pod's GCS emulator."""
    from bench import checkpoint_storage

    r = checkpoint_storage.storage_run()
    save("checkpoint_storage", r)
    figs = checkpoint_storage.storage_figures(r)
    from bench import checkpoint_stall

    stall = checkpoint_stall.stall_run()
    save("checkpoint_stall", stall)
    return [*figs, checkpoint_stall.stall_figure(stall)]


def infra_figs(a, console) -> list[Figure]:
    from bench import infra_eval

    r = infra_eval.run()
    save("infra", r)
    return [
        Figure(
            f"Pulumi program evaluation, all {r['stacks']} stacks (mocks)",
            r["all_stacks_eval_s"],
            "s",
            "< 5 s",
            r["all_stacks_eval_s"] < 5,
            note=f"pulumi_gcp import {r['pulumi_gcp_import_s']:.1f} s apart",
        )
    ]


def recovery_figs(a, console) -> list[Figure]:
    from bench import recovery_bench

    if a.record:  # re-analyse a saved run
        from bench.podrun import RunRecord

        record = RunRecord.load(a.record)
        r = recovery_bench.report_run(record)
        save("recovery", r)
        return measured_at(recovery_bench.figures(r), record.finished, "run ended")
    r = recovery_bench.run(
        OUT, a.preset, a.min_steps, a.notice, sets=tuple(a.sets or GOODPUT_SETS), console=console
    )
    save("recovery", r)
    return recovery_bench.figures(r)


def goodput_figs(a, console) -> list[Figure]:
    from bench import goodput_bench

    kinds = tuple(k.strip() for k in a.faults.split(",") if k.strip())
    if a.record:  # re-analyse a saved run (its period: --period)
        from bench.podrun import RunRecord  # the pod's imports, only where a pod is analysed

        record = RunRecord.load(a.record)
        r = goodput_bench.report_run(record, PNG, a.period)
        save("goodput", r)
        return measured_at(goodput_bench.figures(r), record.finished, "run ended")
    r = goodput_bench.run(
        OUT,
        PNG,
        a.period,
        a.steps,
        kinds,
        a.preset,
        a.notice,
        tuple(a.sets or GOODPUT_SETS),
        console,
    )
    save("goodput", r)
    return goodput_bench.figures(r)


def cost_figs(a, console) -> list[Figure]:
    from bench import cost_bench

    stored = OUT / "goodput.json"
    goodput, label = None, "no measured goodput: run `python -m bench goodput` first"
    if stored.exists():
        g = json.loads(stored.read_text())
        figures = {"headline": g.get("goodput"), "own-rate": g.get("goodput_own_rate")}
        if g.get("goodput") is not None:  # the lower of the two: the cost is not flattered
            name, goodput = min(((k, v) for k, v in figures.items() if v is not None),
                                key=lambda kv: kv[1])  # fmt: skip
            label = f"{name} figure, local pod, P={g['period_s']:g} s, {g['wall_s'] / 60:.1f} min"
    r = cost_bench.run(goodput, label)
    save("cost", r)
    return cost_bench.figures(r)


def faults_figs(a, console) -> list[Figure]:
    from bench import campaign

    per_leg = min(a.per_leg, a.count)
    r = campaign.run(OUT, a.count, a.seed, per_leg, a.preset, tuple(a.sets or GOODPUT_SETS),
                     a.notice, console)  # fmt: skip
    save("faults", r)
    figs = campaign.figures(r)
    if not r["legs_run_now"]:  # every leg was run before: the rows are of those runs
        return measured_at(figs, r["last_leg_saved"], "last leg ended")
    return figs


RUNNERS = {
    "trainer": trainer_figs,
    "gpu": gpu_figs,
    "checkpoint": checkpoint_figs,
    "infra": infra_figs,
    "recovery": recovery_figs,
    "goodput": goodput_figs,
    "cost": cost_figs,
    "faults": faults_figs,
}


def save(name: str, result: dict, out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")


def smoke(out: Path, console: Console) -> list[Figure]:
    """Synthetic record -> recovery and goodput analyses, timeline, cost: no pod, no trainer."""
    from bench import cost_bench, goodput_bench
    from bench.smoke import record

    rec = record()
    g = goodput_bench.analyse(rec)
    g["period_s"] = 0.0
    png = out.parent / "timeline.png"
    g["timeline"] = str(goodput_bench.plot(rec, png, "smoke (synthetic)", g["badput_s"]))
    save("goodput", g, out.parent)
    figs = goodput_bench.figures(g)  # with the recovery rows of its events
    figs += cost_bench.figures(cost_bench.run(g["goodput"], "SYNTHETIC smoke record"))
    for fig in figs:
        fig.name = f"smoke: {fig.name}"
    console.print(f"smoke: goodput {g['goodput']:.1%}, timeline {g['timeline']}")
    return figs


def _interrupt(signum, frame):
    """SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so every pod is torn down."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if unknown := [w for w in a.which if w not in ("all", *ORDER)]:
        p.error(f"unknown benchmark {unknown[0]!r}; choose from all, {', '.join(ORDER)}")
    if a.count < 1 or a.per_leg < 1:
        p.error(f"--count {a.count} / --per-leg {a.per_leg}: both must be at least 1")
    console = Console()
    command = "uv run python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    everything = [w for w in ORDER if w not in NAMED_ONLY or w in a.which]
    which = everything if not a.which or "all" in a.which else [w for w in ORDER if w in a.which]
    if a.smoke:
        out = a.out or OUT / "smoke" / "BENCHMARKS.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").unlink(missing_ok=True)  # smoke rows never accumulate
        figs = smoke(out, console)
        if "checkpoint" in a.which:  # named only: it starts an emulator and imports Orbax
            from bench import checkpoint_storage

            figs += checkpoint_storage.smoke_figures(checkpoint_storage.smoke())
        figures = report.stamp(figs, command)
        report.write(figures, out)
        console.print(f"wrote {out}")
        return 0
    out = a.out or REPO / "BENCHMARKS.md"
    signal.signal(signal.SIGTERM, _interrupt)
    failed = 0
    for name in which:
        console.rule(f"bench {name}")
        machine = f"{report.this_machine()}, {load()} at start"
        started = time.time()
        replace: str | None = name  # a complete run replaces every row of its benchmark
        try:
            figures = RUNNERS[name](a, console)
        except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM (a timeout): say so, then stop
            why = f"not run: interrupted ({err or 'Ctrl-C'}) after {time.time() - started:.0f} s"
            report.write(report.stamp([Figure(f"{name} benchmark", why)], command, name), out,
                         extra=extra(out))  # fmt: skip
            raise
        except ModuleNotFoundError as err:
            figures = [Figure(f"{name} benchmark", f"not run: module {err.name} missing")]
            failed += 1
            replace = None  # keep what an earlier run measured, beside the failure row
        except Exception as err:  # noqa: BLE001 - one broken benchmark must not hide the others
            console.print(traceback.format_exc(), style="red", markup=False, highlight=False)
            figures = [Figure(f"{name} benchmark", f"not run: {type(err).__name__}: {err}"[:200])]
            failed += 1
            replace = None
        for fig in figures:
            fig.machine = fig.machine or machine
            if fig.n is None and not str(fig.value).startswith("not "):
                fig.n = 1  # one measurement unless the benchmark says how many
        report.write(report.stamp(figures, command, name), out, extra=extra(out), replace=replace)
        console.print(f"{name}: {time.time() - started:.0f} s, {len(figures)} rows -> {out}")
    return 1 if failed else 0


def extra(out: Path) -> str:
    """The timeline under the table, when one was drawn."""
    if not PNG.exists():
        return ""
    rel = os.path.relpath(PNG, out.parent)
    return (
        f"## Goodput timeline\n\nTraining step against wall time in the goodput run; faults, "
        f"detections and recoveries marked; underneath, the shares of the badput breakdown (the "
        f"timeline of a run measured before issue 18 has no such bar).\n\n"
        f"![goodput timeline]({rel})\n"
    )


if __name__ == "__main__":
    sys.exit(main())
