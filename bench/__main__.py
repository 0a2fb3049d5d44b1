"""`uv run python -m bench [all|trainer|checkpoint|overhead|verify|recovery|job|goodput|faults|cost|infra]`

Runs the chosen benchmarks, merges their figures into BENCHMARKS.md (each run replaces every row
of its own benchmark and keeps the others'), keeps raw results in bench/out/ and draws the goodput
timeline to docs/goodput-timeline.png. A benchmark that cannot run leaves a "not run: why" row.
`--smoke` runs the reporting path on a synthetic run in seconds (CI) and writes to bench/out/smoke/.
"""

from __future__ import annotations

import argparse
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
from bench.runners import GOODPUT_SETS, OUT, PNG, REPO, RUNNERS, save

ORDER = list(report.BENCH_ORDER)  # the order rows appear in BENCHMARKS.md
NAMED_ONLY = {"faults"}  # hours long: run when named, never by `all`


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


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
        help="recovery/goodput/checkpoint/overhead: analyse this saved run (bench/out/*-run.json; "
        "checkpoint: bench/out/checkpoint.json; overhead: bench/out/overhead.json), run nothing",
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
    p.add_argument("--rounds", type=int, default=3, help="recovery: events of each kind (>= 3)")
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
    p.add_argument("--overhead-steps", type=int, default=1500, help="overhead: steps per run")
    p.add_argument(
        "--overhead-rounds",
        type=int,
        default=5,
        help="overhead: interleaved rounds on the pod (tiny without and with saves every 100 steps)",
    )
    p.add_argument(
        "--job", type=Path, default=REPO / "examples" / "jobs" / "flax-plain",
        help="job: the job directory [examples/jobs/flax-plain]",
    )  # fmt: skip
    p.add_argument("--job-rounds", type=int, default=5, help="job: overhead rounds (>= 3)")
    p.add_argument("--count", type=int, default=100, help="faults: how many faults in all")
    p.add_argument("--seed", type=int, default=0, help="faults: seed of the random mix")
    p.add_argument("--per-leg", type=int, default=25, help="faults: faults per pod run (leg)")
    return p


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
    if a.overhead_steps <= 100 or a.overhead_rounds < 1:
        p.error(f"--overhead-steps {a.overhead_steps} / --overhead-rounds {a.overhead_rounds}: "
                "a run needs more steps than one interval (100), and at least 1 round")  # fmt: skip
    if a.job_rounds < 3:
        p.error(f"--job-rounds {a.job_rounds}: the overhead goal is a median of at least 3 runs")
    if a.rounds < 3:
        p.error(f"--rounds {a.rounds}: the recovery goal is a median of at least 3 events a kind")
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
