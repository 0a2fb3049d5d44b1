"""One runner per benchmark: it runs (or re-analyses a saved run), keeps the raw result in
bench/out/<name>.json and returns its BENCHMARKS.md rows. `bench.__main__` chooses and merges."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from bench import report
from bench.report import Figure, median, spread
from ops.json_file import write_atomic

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
PNG = REPO / "docs" / "goodput-timeline.png"
# tiny's own cadence (every 5 steps) is a test setting; saves to the GCS emulator take seconds.
GOODPUT_SETS = ("checkpoint_every=100",)
OVERHEAD_CONFIG = "tiny"  # `bench overhead`: issue 18's pod goal (<= 1.05 at every 100 steps)


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
    """`1b` on one GPU: MFU against the datasheet peak (trainer.peak.PEAK_FLOPS)."""
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
    """small's checkpoint overhead in one process (1.5-2 h); the storage rows are `bench storage`'s."""
    from bench import checkpoint_bench

    if a.record:  # re-judge a saved run (its checkpoint.json)
        r = json.loads(a.record.read_text())
        return measured_at(checkpoint_bench.figures(r), a.record.stat().st_mtime, "run ended")
    r = checkpoint_bench.run(a.trainer_config, a.checkpoint_steps, repeats=a.checkpoint_repeats,
                             pod=a.checkpoint_pod, console=console)  # fmt: skip
    save("checkpoint", r)
    return checkpoint_bench.figures(r)


def overhead_figs(a, console) -> list[Figure]:
    """tiny's checkpoint overhead on the pod at the goal's interval (every 100 steps), in rounds
    of its own: the checkpoint bench's row (small's overhead) takes 1.5-2 h and stays as it is.
    `--record bench/out/overhead.json` re-judges a saved run."""
    from bench import checkpoint_bench

    if a.record:
        r = json.loads(a.record.read_text())
        return measured_at(checkpoint_bench.figures(r), a.record.stat().st_mtime, "run ended")
    r = checkpoint_bench.run(OVERHEAD_CONFIG, a.overhead_steps, repeats=a.overhead_rounds,
                             pod=True, console=console)  # fmt: skip
    save("overhead", r)
    return checkpoint_bench.figures(r)


def storage_figs(a, console) -> list[Figure]:
    """Restore and save-on-notice seconds, steps lost on a kill, and save stalls on the pod's GCS
    emulator, each case `--storage-runs` times (medians of >= 3); `--record` re-judges a saved
    run (bench/out/storage.json)."""
    from bench import checkpoint_stall, checkpoint_storage

    if a.record:
        r = json.loads(a.record.read_text())
        figs = [*checkpoint_storage.storage_figures(r["storage"]),
                checkpoint_stall.stall_figure(r["stall"])]  # fmt: skip
        return measured_at(figs, a.record.stat().st_mtime, "run ended")
    storage = checkpoint_storage.storage_run(runs=a.storage_runs, console=console)
    stall = []
    for i in range(a.storage_runs):
        console.print(f"save stall run {i + 1} of {a.storage_runs}")
        stall.append(checkpoint_stall.stall_run())
    save("storage", {"storage": storage, "stall": stall})
    return [*checkpoint_storage.storage_figures(storage), checkpoint_stall.stall_figure(stall)]


def infra_figs(a, console) -> list[Figure]:
    from bench import infra_eval

    r = infra_eval.run(a.infra_runs)
    save("infra", r)
    evals = [x["all_stacks_eval_s"] for x in r["runs"]]
    imports = [x["pulumi_gcp_import_s"] for x in r["runs"]]
    value = median(evals)
    return [
        Figure(
            f"Pulumi program evaluation, all {r['stacks']} stacks (mocks)",
            value,
            "s",
            "< 5 s",
            value < 5,
            note=f"median of {len(evals)} fresh interpreters; pulumi_gcp import "
            f"{median(imports):.1f} s apart (median)",
            n=len(evals),
            spread=spread(evals, "s", 2),
        )
    ]


def recovery_figs(a, console, api: str = "tpu") -> list[Figure]:
    from bench import recovery_bench

    name = "recovery" if api == "tpu" else "recovery-compute"
    if a.record:  # re-analyse a saved run
        from bench.podrun import RunRecord

        record = RunRecord.load(a.record)
        r = {**recovery_bench.report_run(record), "api": api}
        save(name, r)
        return measured_at(recovery_bench.figures(r), record.finished, "run ended")
    r = recovery_bench.run(OUT, a.preset, a.min_steps, a.notice, sets=tuple(a.sets or GOODPUT_SETS),
                           console=console, rounds=a.rounds, api=api)  # fmt: skip
    save(name, r)
    return recovery_bench.figures(r)


def recovery_compute_figs(a, console) -> list[Figure]:
    """The same recovery run with the slice a Compute Engine managed instance group."""
    return recovery_figs(a, console, api="compute")


def capacity_figs(a, console) -> list[Figure]:
    from bench import capacity_bench

    if a.record:  # re-analyse the saved runs in that directory
        from bench.podrun import RunRecord

        r = capacity_bench.reanalyse(a.record)
        save("capacity", r)
        ended = max(RunRecord.load(a.record / f"capacity-{leg}-run.json").finished
                    for leg in capacity_bench.LEGS)  # fmt: skip
        return measured_at(capacity_bench.figures(r), ended, "runs ended")
    r = capacity_bench.run(OUT, rounds=a.rounds, min_steps=a.min_steps, console=console)
    save("capacity", r)
    return capacity_bench.figures(r)


def coldboot_figs(a, console) -> list[Figure]:
    """Cold workers' bootstrap: the environment from the package index against the bucket."""
    from bench import coldboot_bench

    if a.record:
        r = json.loads(a.record.read_text())
        return measured_at(coldboot_bench.figures(r), a.record.stat().st_mtime, "run ended")
    r = coldboot_bench.run(OUT, rounds=a.rounds, console=console)
    save("coldboot", r)
    return coldboot_bench.figures(r)


def verify_figs(a, console) -> list[Figure]:
    """What a restore's manifest checks cost, tiny and small, on the pod's GCS emulator."""
    from bench import verify_bench

    if a.record:
        r = json.loads(a.record.read_text())
        return measured_at(verify_bench.figures(r), a.record.stat().st_mtime, "run ended")
    r = verify_bench.run()
    save("verify", r)
    return verify_bench.figures(r)


def job_figs(a, console) -> list[Figure]:
    """A user's program (examples/jobs/flax-plain by default) under tpupod: overhead against
    the same program run directly, and recovery against the built-in trainer's rows."""
    from bench import job_bench

    builtin = job_bench.builtin_rows(REPO / "BENCHMARKS.json")
    if a.record:
        r = json.loads(a.record.read_text())
        return measured_at(job_bench.figures(r, builtin), a.record.stat().st_mtime, "run ended")
    r = job_bench.run(a.job, a.job_rounds, a.rounds, a.notice, OUT, console)
    save("job", r)
    return job_bench.figures(r, builtin)


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


def goodput_mix_figs(name: str):
    """`bench goodput-survive` / `goodput-pinned`: rounds of one fault mix (bench.goodput_mixes)."""

    def figs(a, console) -> list[Figure]:
        from bench import goodput_mixes

        if a.record:  # re-analyse saved runs (bench/out/NAME.json)
            r = json.loads(a.record.read_text())
            return measured_at(goodput_mixes.figures(r), a.record.stat().st_mtime, "run ended")

        r = goodput_mixes.run(name, OUT, a.runs, a.period, a.steps, a.preset, a.notice,
                              tuple(a.sets), console, a.reference)  # fmt: skip
        save(name, r)
        return goodput_mixes.figures(r)

    return figs


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
    from bench import campaign, campaign_report

    per_leg = min(a.per_leg, a.count)
    if not 0.0 <= a.storage_errors < 1.0:
        raise SystemExit(f"--storage-errors must be in [0, 1), not {a.storage_errors:g}")
    r = campaign.run(OUT, a.count, a.seed, per_leg, a.preset, tuple(a.sets or GOODPUT_SETS),
                     a.notice, console, storage_errors=a.storage_errors, legs_now=a.legs)  # fmt: skip
    save("faults", r)
    figs = campaign_report.figures(r)
    if not r["legs_run_now"]:  # every leg was run before: the rows are of those runs
        return measured_at(figs, r["last_leg_saved"], "last leg ended")
    return figs


RUNNERS = {
    "trainer": trainer_figs,
    "gpu": gpu_figs,
    "checkpoint": checkpoint_figs,
    "storage": storage_figs,
    "overhead": overhead_figs,
    "verify": verify_figs,
    "infra": infra_figs,
    "recovery": recovery_figs,
    "recovery-compute": recovery_compute_figs,
    "capacity": capacity_figs,
    "coldboot": coldboot_figs,
    "job": job_figs,
    "goodput": goodput_figs,
    "goodput-survive": goodput_mix_figs("goodput-survive"),
    "goodput-pinned": goodput_mix_figs("goodput-pinned"),
    "cost": cost_figs,
    "faults": faults_figs,
}


def save(name: str, result: dict, out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / f"{name}.json", result, indent=1)
