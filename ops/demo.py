"""`tpupod demo`: a 2-worker local pod trains, hangs, and is preempted (with notice; its first
recreate meets a stockout); the pod's watcher VM recovers it through the TPU API exactly as the
stack's watcher does on GCP, and the final weights are compared with an uninterrupted run.

The watcher VM (localpod.watcher_vm) boots from its own startup script and runs `tpupod watch`
under its supervisor; this process only observes, as a laptop would: it follows the watcher's
journal and lease in the bucket (`tpupod logs --watcher`, `tpupod status`), reads the trainers'
status over SSH, injects the faults when the job is healthy at the planned step, and reports.

The uninterrupted reference runs afterwards in the same pod, over SSH, with the job's own
trainer.env (same venv, config, seed, process count and devices) and only the workdir changed:
cheapest on 2 cores, since it reuses the bootstrapped workers and the warm compilation cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from localpod import watcher_vm
from ops.cli import CliError
from ops.commands import DEMO_MIN_STEPS
from ops.demo_observer import HANG_S, OBSERVE_S, Fault, FaultPlan, TrainerProbe, WatcherView
from ops.provider import ProviderError
from ops.remote_state import RemoteState
from ops.target import ROOT, local_target
from ops.tpu import TpuProvider
from ops.workers import ROOT as REMOTE_ROOT
from ops.workers import WorkerGroup, as_root

REFERENCE_PREFIX = "runs/reference"
NOTICE_S = 60.0  # SIGTERM -> SIGKILL; the trainer exits once its save is committed
WATCH_ARGS = f"--hang-timeout {HANG_S:g} --backoff 1"  # the watcher VM's `tpupod watch` flags
# The reference: the job's trainer.env, exported line by line (values hold spaces), a fresh
# workdir, and no periodic checkpoints (they cannot change the weights; they only cost time).
REFERENCE_COMMAND = (
    f'R={REMOTE_ROOT}; cd -P "$R/current" && '
    'while IFS=\'=\' read -r k v; do export "$k=$v"; done < "$R/trainer.env" && '
    'export TPUPOD_WORKDIR="gs://BUCKET/' + REFERENCE_PREFIX + '" '
    'TPUPOD_STATUS_FILE="$R/reference-status.json" && '
    'read -r -a args <<< "$TPUPOD_TRAINER_ARGS" && '
    '.venv/bin/python -m trainer "${args[@]}" --set checkpoint_every=0 > "$R/reference.log" 2>&1'
)


def pod_provider(pod_dir) -> TpuProvider:
    """The one provider, pointed at the local pod's TPU API through its endpoints.json."""
    return TpuProvider(local_target(pod_dir))


def demo_faults(steps: int) -> list[Fault]:
    """A hang, then a preemption with notice whose first recreate meets a stockout. In this order
    because each fault waits for the laptop to see the trainers at its step: after a hang the
    workers are the same and the laptop's SSH connections still hold, while after a re-creation
    it must describe and connect anew, and a short run could finish in the meantime."""
    return [
        Fault("hang", int(steps * 0.3), lambda pod: pod.hang(1), "hang (SIGSTOP) of worker 1"),
        Fault("preemption", int(steps * 0.45), lambda pod: pod.preempt(NOTICE_S, wait=False),
              f"preemption with {NOTICE_S:g}s notice, then a stockout on the first recreate",
              then=lambda pod: pod.inject_stockout(1)),
    ]  # fmt: skip


def observe(pod, view: WatcherView, plan: FaultPlan, deadline: float) -> dict:
    """Until the watcher VM journals `done` or `gave_up`: draw progress, inject the faults."""
    trainers = TrainerProbe(pod_provider(pod.paths.root))
    logs = watcher_vm.vm_dir(pod.paths.root)
    try:
        while (end := view.final()) is None:
            if not watcher_vm.running(pod.paths.root):
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


def read_object(pod_dir, path: str) -> dict | None:
    """A JSON object from the pod's bucket (its GCS emulator, as named in endpoints.json)."""
    try:
        endpoints = json.loads((Path(pod_dir) / "endpoints.json").read_text())
        url, bucket = endpoints["storage"].rstrip("/"), endpoints["bucket"]
    except (OSError, ValueError, KeyError):
        return None
    obj = quote(path, safe="")
    try:
        with urllib.request.urlopen(
            f"{url}/storage/v1/b/{bucket}/o/{obj}?alt=media", timeout=30
        ) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def reference_command(pod_dir) -> str:
    """As root, like the trainer itself: it writes its status and log under $TPUPOD_ROOT."""
    bucket = json.loads((Path(pod_dir) / "endpoints.json").read_text())["bucket"]
    return as_root(REFERENCE_COMMAND.replace("BUCKET", bucket))


def run_reference(pod, console: Console) -> tuple[dict | None, float]:
    started = time.time()
    command = reference_command(pod.paths.root)
    workers = pod_provider(pod.paths.root).describe().workers
    with (
        console.status("uninterrupted reference run (same trainer.env, fresh workdir)"),
        WorkerGroup(workers, retries=0) as group,
    ):
        outcomes = group.run(command, timeout=900.0)
    bad = [o for o in outcomes.values() if not o.ok]
    if bad:
        console.print(f"reference run failed on worker {bad[0].index} (exit {bad[0].exited})")
        return None, time.time() - started
    return read_object(pod.paths.root, f"{REFERENCE_PREFIX}/summary.json"), time.time() - started


def report(console, events, injected, summary, reference, wall, ref_wall, holder=None) -> bool:
    events = [e for e in events if e.get("by") != "demo"]  # the watcher's
    by = {e["event"]: e for e in events}
    detected = [e for e in events if e["event"] == "detected"]
    resumed = [e for e in events if e["event"] == "resumed"]
    first_training = next((e["time"] for e in events if e["event"] == "watching"), 0.0)
    train_wall = by.get("done", {}).get("time", time.time()) - first_training
    downtime = sum(e.get("recovery_s", 0.0) for e in resumed)
    equal = bool(summary and reference) and (
        summary.get("params_fingerprint") == reference.get("params_fingerprint")
    )
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
    stockouts = sum(e["event"] == "stockout" for e in events)
    table.add_row("stockouts on recreate", f"{stockouts} (retried; not a preemption or failure)")
    table.add_row("steps lost (total)", str(sum(e.get("steps_lost", 0) for e in resumed)))
    fp = (summary or {}).get("params_fingerprint", "missing")
    table.add_row("final params_fingerprint", str(fp))
    table.add_row("equals uninterrupted run", "[green]yes[/green]" if equal else "[red]no[/red]")
    console.print(table)
    return equal


def print_sample(pod_dir, console: Console, prompt: str = "def ") -> None:
    """One short sample from the run's final checkpoint (`python -m trainer sample`, here, reading
    the pod's bucket): what the weights that survived the faults say. Never fails the demo."""
    endpoints = json.loads((Path(pod_dir) / "endpoints.json").read_text())
    url = endpoints["storage"].rstrip("/")
    env = {**os.environ, "STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           "GOOGLE_AUTH_TOKEN_FOR_TESTING": "x", "FSSPEC_GCS_TOKEN": "anon", "NO_GCE_CHECK": "true",
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "JAX_PLATFORMS": "cpu"}  # fmt: skip
    command = [sys.executable, "-m", "trainer", "sample", "--prompt", prompt, "--tokens", "48",
               "--workdir", f"gs://{endpoints['bucket']}/runs/local"]  # fmt: skip
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=180)  # fmt: skip
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        why = "timed out" if done is None else (done.stderr.strip().splitlines() or ["?"])[-1]
        console.print(f"sample: not available ({why})", style="dim")
        return
    console.print("sample from the final checkpoint:", style="bold")
    console.print(done.stdout.rstrip(), markup=False, highlight=False)


def run_demo(args: argparse.Namespace) -> int:
    from localpod.pod import LocalPod
    from localpod.state import PodError

    console = Console()
    steps, preset = args.steps, args.preset
    if steps < DEMO_MIN_STEPS:
        raise CliError(
            f"--steps must be at least {DEMO_MIN_STEPS} (room for a hang and a preemption)"
        )
    pod_dir = args.pod_dir or ROOT / ".tpupod" / "demo"
    # A save every 10 steps: enough to show a hang's lost steps, few enough for a 2-core machine.
    job = f"--config {preset} --steps {steps} --set checkpoint_every=10"
    pod = LocalPod(pod_dir, workers=2, trainer_args=job)
    journal_file = pod.paths.root / "journal.jsonl"
    started = time.time()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with console.status("bringing up a 2-worker local pod and its watcher VM") as status:
            pod.up(progress=status.update)
            shutil.rmtree(watcher_vm.vm_dir(pod.paths.root), ignore_errors=True)  # a fresh VM
            watcher_vm.start(pod.paths.root, watch_args=WATCH_ARGS)
        state = RemoteState.for_target(local_target(pod.paths.root))
        console.print(f"recovery: the watcher VM ({watcher_vm.HOLDER}) runs `tpupod watch`; this "
                      f"terminal only reads gs://{state.bucket.name}/{state.prefix}, probes the "
                      "trainers and injects the faults", style="dim")  # fmt: skip
        plan = FaultPlan(demo_faults(steps), pod)
        columns = [TextColumn("training {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn()]  # fmt: skip
        with Progress(*columns, console=console) as progress:
            plan.progress, plan.task = progress, progress.add_task(preset, total=steps)
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
        summary = read_object(pod.paths.root, "runs/local/summary.json")
        reference, ref_wall = run_reference(pod, console)
        equal = report(console, view.events, plan.injected, summary, reference,
                       time.time() - started, ref_wall, holder)  # fmt: skip
        print_sample(pod.paths.root, console)
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


def _interrupt(*_args) -> None:
    raise KeyboardInterrupt
