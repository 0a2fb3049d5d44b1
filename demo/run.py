"""`tpupod demo [--job DIR]`: a 2-worker local pod runs a job (the built-in trainer's, or any
job directory) and meets a hang, a crash and a preemption with notice while its zone has no
capacity (it comes back in the other zone); the pod's watcher VM recovers each through the TPU API exactly as the stack's
watcher does on GCP; then the same job runs once without faults and the two runs' final
committed checkpoints are compared array by array, bitwise (ops.commands.checkpoint_compare).

The watcher VM (localpod.vm.watcher_vm) boots from its own startup script and runs `tpupod watch`
under its supervisor (with `--api compute` the slice is a managed instance group through the
pod's Compute Engine API, and the watcher holds a Compute Engine stack's role); this process only
observes, as a laptop would: it follows the watcher's
journal and lease in the bucket (`tpupod logs --watcher`, `tpupod status`), reads the jobs'
status over SSH, injects the faults when the job is healthy at the planned step, and reports.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contract import job as jobs
from contract.layout import checkpoint_dir
from demo.observer import HANG_S, OBSERVE_S, Fault, FaultPlan, TrainerProbe, WatcherView
from demo.reference import compare_runs, emulator_env, pod_provider, run_reference
from infra import builtin_job
from localpod.gcp import iam_policy
from localpod.gcp.iam_report import IamReport, summarize
from localpod.pod import LocalPod
from localpod.state import PodError
from localpod.vm import watcher_vm
from ops.cli import CliError
from ops.cloud.slice import ProviderError
from ops.cloud.target import ROOT, local_target
from ops.watch.remote_state import RemoteState

# Tiny steps about ten times a second on the pod, and each fault waits until the laptop sees the
# trainers at its step (a second or two after the previous recovery): at 60 steps a run once
# finished before its second fault could be injected.
DEMO_STEPS, DEMO_MIN_STEPS = 150, 100
NOTICE_S = 60.0  # SIGTERM -> SIGKILL; the job exits once its save is committed
# The watcher VM's `tpupod watch` flags: a hang is a heartbeat (the built-in trainer's) or the
# slice's progress (any job's) this many seconds old.
WATCH_ARGS = f"--hang-timeout {HANG_S:g} --stall-timeout {HANG_S * 1.5:g} --backoff 1"


def demo_faults(steps: int) -> list[Fault]:
    """A hang, a crash, then a preemption with notice while the slice's zone has no capacity
    (the recreate moves to the pod's other zone). In
    this order because each fault waits for the laptop to see the job at its step: after a hang
    or a crash the workers are the same and the laptop's SSH connections still hold, while
    after a re-creation it must describe and connect anew, and a short run could finish in the
    meantime."""
    return [
        Fault("hang", int(steps * 0.25), worker=1),
        Fault("crash", int(steps * 0.4), worker=0),
        Fault("stockout", int(steps * 0.55), notice=NOTICE_S),
    ]


def demo_job(args: argparse.Namespace) -> jobs.Job:
    """`--job DIR`, else the built-in trainer's job (a save every 10 steps: enough to show a
    hang's lost steps, few enough for a 2-core machine)."""
    if args.job is None:
        if args.steps < DEMO_MIN_STEPS:
            raise CliError(f"--steps must be at least {DEMO_MIN_STEPS} (room for three faults)")
        return builtin_job.builtin(f"--config {args.preset} --steps {args.steps} "
                            "--set checkpoint_every=10")  # fmt: skip
    job = jobs.load(args.job)
    if not job.spec.steps or job.spec.progress == "none":
        raise CliError(f"{args.job}: the demo times its faults by the job's progress: declare "
                       "`steps` and `progress` (status or regex) in tpupod-job.yaml")  # fmt: skip
    return job


def observe(pod, view: WatcherView, plan: FaultPlan, deadline: float) -> dict:
    """Until the watcher VM journals `done` or `gave_up`: draw progress, inject the faults."""
    trainers = TrainerProbe(pod_provider(pod.paths.root))
    logs = watcher_vm.vm_dir(pod.paths.root)
    try:
        while (end := view.final()) is None:
            if not watcher_vm.running(pod.paths.root):
                view.poll()  # it may have stopped right after journaling its last line
                if (end := view.final()) is not None:
                    return end
                raise CliError(f"the watcher VM stopped; see {logs}/boot.log and vm.log")
            if time.time() > deadline:
                raise CliError(
                    f"no `done` from the watcher VM in time; see {logs}/root/watcher.log"
                )
            if view.seen("watching"):
                plan.observed(view, trainers)
            time.sleep(OBSERVE_S)
            view.poll()
        return end
    finally:
        trainers.close()


def report(console, events, injected, comparison, wall, ref_wall, holder=None,
           iam: IamReport | None = None) -> bool:  # fmt: skip
    events = [e for e in events if e.get("by") != "demo"]  # the watcher's
    by = {e["event"]: e for e in events}
    detected = [e for e in events if e["event"] == "detected"]
    resumed = [e for e in events if e["event"] == "resumed"]
    first_training = next((e["time"] for e in events if e["event"] == "watching"), 0.0)
    train_wall = by.get("done", {}).get("time", time.time()) - first_training
    downtime = sum(e.get("recovery_s", 0.0) for e in resumed)
    equal = comparison is not None and comparison.equal
    table = Table(title="tpupod demo", show_header=False)
    table.add_row("steps", str(by.get("done", {}).get("step", "?")))
    table.add_row("wall time (everything)", f"{wall:.0f}s")
    table.add_row("watched run (watch start -> done)", f"{train_wall:.0f}s")
    table.add_row("uninterrupted reference run", f"{ref_wall:.0f}s")
    if holder is not None:
        table.add_row("recovered by", f"{holder} (lease holder; this terminal only observed)")
    table.add_row(
        "goodput (1 - downtime / watched run)", f"{1 - downtime / max(train_wall, 1):.1%}"
    )
    for det, res in zip(detected, resumed, strict=False):
        kind = det.get("kind")
        latency = det["time"] - injected.get(kind, det["time"]) if kind in injected else None
        table.add_row(
            f"{kind}",
            (f"detected {latency:.1f}s after injection, " if latency is not None else "")
            + f"resumed at step {res.get('step')} in {res.get('recovery_s', 0):.1f}s, "
            f"{res.get('steps_lost')} steps lost",
        )
    moves = [e for e in events if e["event"] in ("stockout", "beside")
             and e.get("next_zone") != e.get("zone")]  # fmt: skip
    table.add_row("zones left for capacity", ", ".join(f"{e['zone']} -> {e['next_zone']}"
                                                      for e in moves) or "none")  # fmt: skip
    table.add_row("steps lost (total)", str(sum(e.get("steps_lost", 0) for e in resumed)))
    compared = comparison.lines() if comparison else ["comparison failed (see above)"]
    table.add_row("final checkpoints", "\n".join(compared))
    table.add_row("equals uninterrupted run", "[green]yes[/green]" if equal else "[red]no[/red]")
    if iam is not None:  # every call of the run against the stack's grants (localpod.gcp.authz)
        style = "green" if iam.least_privilege else "red"
        table.add_row(
            "IAM (the stack's grants)", f"[{style}]" + "\n".join(iam.lines()) + f"[/{style}]"
        )
    console.print(table)
    return equal


def print_sample(pod_dir, workdir: str, console: Console, prompt: str = "def ") -> None:
    """The built-in trainer's job only: one short sample from the run's final checkpoint
    (`python -m trainer sample`, here, reading the pod's bucket). Never fails the demo."""
    command = [sys.executable, "-m", "trainer", "sample", "--prompt", prompt, "--tokens", "48",
               "--workdir", workdir]  # fmt: skip
    try:
        done = subprocess.run(command, cwd=ROOT, env=emulator_env(pod_dir), capture_output=True,
                              text=True, timeout=180)  # fmt: skip
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        why = "timed out" if done is None else (done.stderr.strip().splitlines() or ["?"])[-1]
        console.print(f"sample: not available ({why})", style="dim")
        return
    console.print("sample from the final checkpoint:", style="bold")
    console.print(done.stdout.rstrip(), markup=False, highlight=False)


def run_demo(args: argparse.Namespace) -> int:
    console = Console()
    job = demo_job(args)
    steps = job.spec.steps
    pod_dir = args.pod_dir or ROOT / ".tpupod" / "demo"
    pod = LocalPod(pod_dir, workers=2, job=job, api=args.api,
                   iam_stack=iam_policy.stack_for(args.api))  # fmt: skip
    journal_file = pod.paths.root / "journal.jsonl"
    started = time.time()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with console.status("bringing up a 2-worker local pod and its watcher VM") as status:
            pod.up(progress=status.update)
            shutil.rmtree(watcher_vm.vm_dir(pod.paths.root), ignore_errors=True)  # a fresh VM
            watcher_vm.start(pod.paths.root, watch_args=WATCH_ARGS)
        state = RemoteState.for_target(local_target(pod.paths.root))
        console.print(f"job: {job.source}; run {pod.run_id}, {SLICE_BY[args.api]}. Recovery: "
                      f"the watcher VM ({watcher_vm.HOLDER}) runs `tpupod watch`; this terminal "
                      f"only reads gs://{state.bucket.name}/{state.prefix}, probes the job and "
                      "injects the faults", style="dim")  # fmt: skip
        plan = FaultPlan(demo_faults(steps), pod)
        columns = [TextColumn("training {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn()]  # fmt: skip
        with Progress(*columns, console=console) as progress:
            plan.progress, plan.task = progress, progress.add_task("job", total=steps)
            view = WatcherView(state, journal_file, progress.console)
            end = observe(pod, view, plan, deadline=time.time() + max(900.0, steps * 15.0))
            progress.update(plan.task, completed=end.get("step", 0))
        holder = view.holder()
        view.note("lease", f"last held by {holder}", holder=holder)
        if end["event"] != "done":
            console.print(f"[red]the watcher gave up[/red]: {end.get('message')}")
            return 1
        if missed := plan.missed():
            console.print(f"[red]the run reached step {end.get('step')} before this fault could "
                          f"be injected[/red]: {missed[0].label}; try again with more --steps")  # fmt: skip
            return 1
        reference = f"{pod.run_id}-reference"
        with console.status(f"the same job once more, uninterrupted (run {reference})"):
            ok, ref_wall = run_reference(pod.paths.root, reference)
        if not ok:
            console.print(f"[red]the uninterrupted run failed[/red]; see reference.log on the "
                          f"workers ({pod.paths.root}/workers/<i>/tpupod)")  # fmt: skip
            return 1
        run_dir = f"gs://{pod.bucket}/{pod.run_prefix}"
        ref_dir = run_dir.rsplit("/", 1)[0] + f"/{reference}"
        comparison = compare_runs(pod.paths.root, checkpoint_dir(run_dir), checkpoint_dir(ref_dir))
        equal = report(console, view.events, plan.injected, comparison,
                       time.time() - started, ref_wall, holder, summarize(pod.paths.root))  # fmt: skip
        if args.job is None:
            print_sample(pod.paths.root, run_dir, console)
        console.print(f"journal: {journal_file}", style="dim")
        return 0 if equal else 1
    except (PodError, ProviderError) as err:
        raise CliError(str(err)) from None
    finally:
        # Ctrl-C under `uv run` arrives twice (the terminal's, then uv forwards it): a second
        # KeyboardInterrupt must not cut the teardown short.
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            with console.status("tearing the pod and its watcher VM down"):
                pod.down()
        finally:
            signal.signal(signal.SIGINT, interrupt)
            signal.signal(signal.SIGTERM, previous)


SLICE_BY = {"tpu": "a node through the Cloud TPU API",
            "compute": "a managed instance group through Compute Engine"}  # fmt: skip


def _interrupt(*_args) -> None:
    raise KeyboardInterrupt


def register(subparsers: argparse._SubParsersAction) -> None:
    """`tpupod demo`, registered through the `tpupod.commands` entry points (pyproject.toml)."""
    demo = subparsers.add_parser(
        "demo",
        help="local pod: run a job through a hang, a crash and a preemption, recover each, and "
        "compare its final checkpoint with an uninterrupted run's, bitwise",
    )
    demo.add_argument(
        "--job", type=Path,
        help="a job directory (tpupod-job.yaml, with steps and progress) [the built-in trainer]",
    )  # fmt: skip
    demo.add_argument("--preset", default="tiny", help="the built-in trainer's config preset")
    demo.add_argument(
        "--steps",
        type=int,
        default=DEMO_STEPS,
        help=f"training steps (at least {DEMO_MIN_STEPS}) [{DEMO_STEPS}]",
    )
    demo.add_argument(
        "--api", choices=("tpu", "compute"), default="tpu",
        help="the slice as a Cloud TPU API node, or as a Compute Engine managed instance group "
        "(TPU7x's only path), recovered by the pod's watcher VM either way [tpu]",
    )  # fmt: skip
    demo.add_argument("--pod-dir", type=Path, help=argparse.SUPPRESS)
    demo.set_defaults(func=run_demo)
