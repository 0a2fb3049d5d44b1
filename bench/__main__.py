"""`uv run python -m bench [NAME [flags]]`: NAME is all (the default) or one of trainer, gpu,
checkpoint, storage, overhead, verify, infra, recovery, capacity, coldboot, job, goodput,
goodput-survive, goodput-pinned, cost, faults; `NAME --help` lists its flags.
`uv run python -m bench report` renders BENCHMARKS.md again from BENCHMARKS.json, running nothing.

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

from bench import flags, report
from bench.report import Figure
from bench.runners import OUT, REPO, RUNNERS, save

ORDER = list(report.BENCH_ORDER)  # the order rows appear in BENCHMARKS.md
# Run when named, never by `all`: faults and the goodput mixes are hours long; recovery-compute
# repeats recovery's schedule on the other path (issue 51), its rows beside recovery's.
NAMED_ONLY = {"faults", "recovery-compute", "goodput-survive", "goodput-pinned"}


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


DESCRIPTION = {
    "trainer": "the trainer's step time and MFU on this machine's CPU",
    "gpu": "`1b` on one GPU: MFU against the datasheet peak",
    "checkpoint": "what checkpoints cost: async and sync saves' overhead on small's loop",
    "storage": "checkpoints on the pod's storage: restore and save-on-notice seconds, steps lost "
    "on a kill, save stalls",
    "overhead": "the pod's training loop without and with saves every 100 steps",
    "verify": "what checkpoint verification adds to restore time (tiny, small)",
    "infra": "the Pulumi program's resources and policy findings, per stack",
    "recovery": "seconds from each fault to training again, and steps lost, on the local pod",
    "recovery-compute": "the same, with the slice a Compute Engine managed instance group",
    "job": "a user's job under tpupod: overhead against running it directly, and its recovery",
    "capacity": "recovery through a queued resource vs nodes.create, and the work a no-notice "
    "kill loses under the time bound",
    "coldboot": "cold workers' bootstrap: the environment from the package index vs the bucket",
    "goodput": "a long pod run with faults every --period seconds: goodput and badput",
    "goodput-survive": "goodput by Google's definition, >= 3 runs of >= 20 min, a crash or a hang "
    "every --period seconds",
    "goodput-pinned": "goodput by Google's definition, >= 3 runs, the pinned mix (2 notice, 2 "
    "kill, 1 crash, 1 hang) every --period seconds",
    "cost": "dollars per useful training hour, spot against on-demand",
    "faults": "the fault campaign: a seeded mix of every fault kind, 0 committed checkpoints lost",
}


def parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """`python -m bench [--smoke] [NAME [NAME's flags]]`; `NAME --help` shows NAME's flags."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[1])
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument(
        "--out", type=Path, help="markdown file [BENCHMARKS.md; smoke: bench/out/smoke]"
    )
    p.add_argument("--smoke", action="store_true", help="synthetic run, seconds, no pod (CI)")
    p.add_argument("--out", dest="top_out", type=Path, help=argparse.SUPPRESS)  # before NAME
    sub = p.add_subparsers(dest="bench", metavar="NAME", help=f"all (default), {', '.join(ORDER)}")
    subs = {"all": sub.add_parser("all", parents=[out], help="every benchmark but faults")}
    for name in ORDER:
        subs[name] = sub.add_parser(name, parents=[out], help=DESCRIPTION.get(name, name),
                                    description=DESCRIPTION.get(name))  # fmt: skip
        flags.add_flags(subs[name], name)
    subs["report"] = sub.add_parser("report", parents=[out], help="render BENCHMARKS.md from "
                                    "BENCHMARKS.json again (the rules applied), run nothing")  # fmt: skip
    return p, subs


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
    p, subs = parser()
    a = p.parse_args(argv)
    named = a.bench if a.bench not in (None, "all") else None
    a.out = getattr(a, "out", None) or a.top_out
    if named == "report":
        report.render(a.out or REPO / "BENCHMARKS.md")
        return 0
    if named:
        flags.check(subs[named], a)
    console = Console()
    command = "uv run python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    which = [named] if named else [w for w in ORDER if w not in NAMED_ONLY]
    # Every benchmark runs with its own flags: the named one's as given, the others' defaults.
    args = {w: a if w == named else subs[w].parse_args([]) for w in which}
    if a.smoke:
        out = a.out or OUT / "smoke" / "BENCHMARKS.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").unlink(missing_ok=True)  # smoke rows never accumulate
        figs = smoke(out, console)
        if named == "storage":  # named only: it starts an emulator and imports Orbax
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
            figures = RUNNERS[name](args[name], console)
        except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM (a timeout): say so, then stop
            why = f"not run: interrupted ({err or 'Ctrl-C'}) after {time.time() - started:.0f} s"
            report.write(report.stamp([Figure(f"{name} benchmark", why)], command, name), out)
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
        report.write(report.stamp(figures, command, name), out, replace=replace)
        console.print(f"{name}: {time.time() - started:.0f} s, {len(figures)} rows -> {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
