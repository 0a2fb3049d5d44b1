"""`tpupod demo`: a 2-worker local pod trains, is preempted (with notice; its first recreate
meets a stockout) and hangs, recovers through `watch` and the TPU API exactly as on GCP, and its
final weights are compared with an uninterrupted run of the same job.

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
from pathlib import Path
from urllib.parse import quote

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ops.cli import CliError
from ops.incident import IncidentStore
from ops.journal import Journal
from ops.provider import ProviderError
from ops.recovery import Limits, Probe
from ops.target import ROOT, local_target
from ops.tpu import TpuProvider
from ops.watch import WatchConfig, Watcher
from ops.workers import ROOT as REMOTE_ROOT
from ops.workers import WorkerGroup, as_root

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
                       backoff_base=1.0, capacity_backoff=1.0)  # fmt: skip


def pod_provider(pod_dir) -> TpuProvider:
    """The one provider, pointed at the local pod's TPU API through its endpoints.json."""
    return TpuProvider(local_target(pod_dir))


@dataclass
class Fault:
    kind: str  # the incident kind watch reports for it
    at_step: int
    inject: Callable[[object], object]  # LocalPod -> anything
    label: str
    then: Callable[[object], object] | None = None  # also, right after the injection


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
                if fault.then is not None:
                    fault.then(self.pod)
            except Exception as err:  # noqa: BLE001 - the slice moved on; try again next poll
                watcher.journal.event("error", f"fault injection deferred: {err}")
                return
            self.injected[fault.kind] = time.time()
            watcher.journal.event(
                "injected", f"{fault.label} at step ~{min(steps)}", kind=fault.kind, step=min(steps)
            )


def demo_faults(steps: int) -> list[Fault]:
    """A preemption with notice whose first recreate meets a stockout, then a hang."""
    return [
        Fault("preemption", int(steps * 0.3), lambda pod: pod.preempt(NOTICE_S, wait=False),
              f"preemption with {NOTICE_S:g}s notice, then a stockout on the first recreate",
              then=lambda pod: pod.inject_stockout(1)),
        Fault("hang", int(steps * 0.65), lambda pod: pod.hang(1), "hang (SIGSTOP) of worker 1"),
    ]  # fmt: skip


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
    stockouts = sum(e["event"] == "stockout" for e in events)
    table.add_row("stockouts on recreate", f"{stockouts} (retried; not a preemption or failure)")
    table.add_row("steps lost (total)", str(sum(e.get("steps_lost", 0) for e in resumed)))
    fp = (summary or {}).get("params_fingerprint", "missing")
    table.add_row("final params_fingerprint", str(fp))
    table.add_row("equals uninterrupted run", "[green]yes[/green]" if equal else "[red]no[/red]")
    console.print(table)
    return equal


def run_demo(args: argparse.Namespace) -> int:
    from localpod.pod import LocalPod
    from localpod.state import PodError

    console = Console()
    steps, preset = args.steps, args.preset
    if steps < 20:
        raise CliError("--steps must be at least 20 (room for a preemption and a hang)")
    pod_dir = args.pod_dir or ROOT / ".tpupod" / "demo"
    # A save every 10 steps: enough to show a hang's lost steps, few enough for a 2-core machine.
    job = f"--config {preset} --steps {steps} --set checkpoint_every=10"
    pod = LocalPod(pod_dir, workers=2, trainer_args=job)
    journal_file = pod.paths.root / "journal.jsonl"
    store = IncidentStore(pod.paths.root / "incident.json")
    started = time.time()
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with console.status("bringing up a 2-worker local pod") as status:
            pod.up(progress=status.update)
        journal_file.unlink(missing_ok=True)
        store.clear()
        plan = FaultPlan(demo_faults(steps), pod)
        columns = [TextColumn("training {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn()]  # fmt: skip
        with Progress(*columns, console=console) as progress:
            plan.progress, plan.task = progress, progress.add_task(preset, total=steps)
            journal = Journal(journal_file, progress.console)
            provider = pod_provider(pod.paths.root)
            code = Watcher(provider, journal, demo_config(), on_poll=plan, store=store).run()
        if code != 0:
            console.print(f"[red]watch ended with {code}[/red]; journal {journal_file}")
            return code
        summary = read_object(pod.paths.root, "runs/local/summary.json")
        reference, ref_wall = run_reference(pod, console)
        equal = report(console, journal.events, plan.injected, summary, reference,
                       time.time() - started, ref_wall)  # fmt: skip
        console.print(f"journal: {journal_file}", style="dim")
        return 0 if equal else 1
    except (PodError, ProviderError) as err:
        raise CliError(str(err)) from None
    finally:
        with console.status("tearing the pod down"):
            pod.down()
        signal.signal(signal.SIGTERM, previous)


def _interrupt(*_args) -> None:
    raise KeyboardInterrupt
