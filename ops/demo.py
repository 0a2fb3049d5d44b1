"""`tpupod demo`: a 2-worker local pod trains, is preempted (with notice) and hangs, recovers
through `watch`, and its final weights are compared with an uninterrupted run of the same job.

The uninterrupted reference runs afterwards in the same pod, over SSH, with the job's own
trainer.env (same venv, config, seed, process count and devices) and only the workdir changed:
cheapest on 2 cores, since it reuses the bootstrapped workers and the warm compilation cache.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ops.cli import CliError
from ops.journal import Journal
from ops.providers import ROOT
from ops.recovery import Limits, Probe
from ops.watch import WatchConfig, Watcher
from ops.workers import ROOT as REMOTE_ROOT
from ops.workers import WorkerGroup

REFERENCE_PREFIX = "runs/reference"
NOTICE_S = 60.0  # SIGTERM -> SIGKILL; the trainer exits once its save is committed
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


def demo_config(hang: float = 10.0) -> WatchConfig:
    limits = Limits(hang=hang, start=300.0, stall=400.0, bootstrap=600.0, ssh=60.0,
                    preempt_grace=NOTICE_S + 15)  # fmt: skip
    return WatchConfig(limits=limits, poll=0.5, max_failures=3, ready_deadline=180.0,
                       backoff_base=1.0)  # fmt: skip


@dataclass
class Fault:
    kind: str  # the incident kind watch reports for it
    at_step: int
    inject: Callable[[object], object]  # LocalPod -> anything
    label: str


@dataclass
class FaultPlan:
    """Injects faults in order, each once the previous one has been recovered (on_poll hook)."""

    faults: list[Fault]
    pod: object
    injected: dict[str, float] = field(default_factory=dict)
    progress: Progress | None = None
    task: int | None = None

    def __call__(self, watcher: Watcher, probes: list[Probe]) -> None:
        steps = [p.status.step for p in probes if p.status and p.status.heartbeat >= watcher.since]
        if self.progress is not None and steps:
            self.progress.update(self.task, completed=max(steps))
        pending = [f for f in self.faults if f.kind not in self.injected]
        if not pending or not steps or len(steps) < len(probes):
            return
        last = max(self.injected.values(), default=0.0)
        inc = watcher.incident
        settled = not self.injected or (
            inc is not None and inc.detected_at >= last and "resumed" in inc.phases
        )
        fault = pending[0]
        if settled and min(steps) >= fault.at_step:
            try:
                fault.inject(self.pod)
            except Exception as err:  # noqa: BLE001 - the slice moved on; try again next poll
                watcher.journal.event("error", f"fault injection deferred: {err}")
                return
            self.injected[fault.kind] = time.time()
            watcher.journal.event(
                "injected", f"{fault.label} at step ~{min(steps)}", kind=fault.kind, step=min(steps)
            )


def demo_faults(steps: int) -> list[Fault]:
    return [
        Fault("preemption", int(steps * 0.3), lambda pod: pod.preempt(NOTICE_S, wait=False),
              f"preemption with {NOTICE_S:g}s notice"),
        Fault("hang", int(steps * 0.65), lambda pod: pod.hang(1), "hang (SIGSTOP) of worker 1"),
    ]  # fmt: skip


def read_object(pod_info, path: str) -> dict | None:
    url = pod_info.pod.get("emulator_url")
    bucket = pod_info.pod.get("bucket")
    if not url or not bucket:
        return None
    obj = quote(path, safe="")
    try:
        with urllib.request.urlopen(
            f"{url}/storage/v1/b/{bucket}/o/{obj}?alt=media", timeout=30
        ) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def run_reference(pod, console: Console) -> tuple[dict | None, float]:
    info = pod.describe()
    started = time.time()
    command = REFERENCE_COMMAND.replace("BUCKET", info.pod.get("bucket", "tpupod-local"))
    from ops.providers.local import LocalProvider

    workers = LocalProvider(pod).describe().workers
    with (
        console.status("uninterrupted reference run (same trainer.env, fresh workdir)"),
        WorkerGroup(workers, retries=0) as group,
    ):
        outcomes = group.run(command, timeout=900.0)
    bad = [o for o in outcomes.values() if not o.ok]
    if bad:
        console.print(f"reference run failed on worker {bad[0].index} (exit {bad[0].exited})")
        return None, time.time() - started
    return read_object(info, f"{REFERENCE_PREFIX}/summary.json"), time.time() - started


def report(console, events, injected, summary, reference, wall, ref_wall) -> bool:
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
    table.add_row("steps lost (total)", str(sum(e.get("steps_lost", 0) for e in resumed)))
    fp = (summary or {}).get("params_fingerprint", "missing")
    table.add_row("final params_fingerprint", str(fp))
    table.add_row("equals uninterrupted run", "[green]yes[/green]" if equal else "[red]no[/red]")
    console.print(table)
    return equal


def run_demo(args: argparse.Namespace) -> int:
    from localpod.pod import LocalPod
    from localpod.state import PodError
    from ops.providers.local import LocalProvider

    console = Console()
    steps, preset = args.steps, args.preset
    if steps < 20:
        raise CliError("--steps must be at least 20 (room for a preemption and a hang)")
    pod_dir = args.pod_dir or ROOT / ".tpupod" / "demo"
    # A save every 10 steps: enough to show a hang's lost steps, few enough for a 2-core machine.
    job = f"--config {preset} --steps {steps} --set checkpoint_every=10"
    pod = LocalPod(pod_dir, workers=2, trainer_args=job)
    journal_file = pod.paths.root / "journal.jsonl"
    started = time.time()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with console.status("bringing up a 2-worker local pod") as status:
            pod.up(progress=status.update)
        journal_file.unlink(missing_ok=True)
        plan = FaultPlan(demo_faults(steps), pod)
        columns = [TextColumn("training {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn()]  # fmt: skip
        with Progress(*columns, console=console) as progress:
            plan.progress, plan.task = progress, progress.add_task(preset, total=steps)
            journal = Journal(journal_file, progress.console)
            code = Watcher(LocalProvider(pod), journal, demo_config(), on_poll=plan).run()
        if code != 0:
            console.print(f"[red]watch ended with {code}[/red]; journal {journal_file}")
            return code
        summary = read_object(pod.describe(), "runs/local/summary.json")
        reference, ref_wall = run_reference(pod, console)
        equal = report(console, journal.events, plan.injected, summary, reference,
                       time.time() - started, ref_wall)  # fmt: skip
        console.print(f"journal: {journal_file}", style="dim")
        return 0 if equal else 1
    except PodError as err:
        raise CliError(str(err)) from None
    finally:
        with console.status("tearing the pod down"):
            pod.down()
        signal.signal(signal.SIGTERM, previous)


def _interrupt(*_args) -> None:
    raise KeyboardInterrupt
