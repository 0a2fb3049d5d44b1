"""One benchmark run on a local pod: bring it up, watch it with `ops.watch.Watcher` while a fault
schedule injects events and a sampler records the workers' files, then tear it down.

The pod, the watch loop and the journal are the real ones the demo uses (`demo.run`); the
benchmarks run the built-in trainer's job (`trainer_args`), whose uninterrupted references run
the trainer itself with the job's environment. This module only wires them together and keeps
what the analyses need.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console

from bench.faults import Schedule, Stop, WatchKilled
from bench.sampler import Sampler
from ops.fleet.job_status import JobRules
from ops.json_file import write_atomic
from ops.watch import Limits, WatchConfig, Watcher
from ops.watch.deadlines import PROFILES
from ops.watch.incident import IncidentStore
from ops.watch.journal import Journal

POLL_S = 0.5  # the watch's poll here, and the references' observation load


def watch_config(notice: float, hang: float = 30.0, rules: JobRules | None = None) -> WatchConfig:
    """Short deadlines for one machine; poll 0.5 s like the demo, and its step clock (the local
    profile's: a hang told ~2 s after the job's normal step gap). The job's rules (exit codes,
    steps, progress) as the watch reads them from its spec."""
    clock = {k: PROFILES["local"][k] for k in ("step_clock", "step_floor")}
    limits = Limits(hang=hang, start=300.0, bootstrap=600.0, ssh=60.0, preempt_grace=notice + 15,
                    **clock)  # fmt: skip
    return WatchConfig(
        limits=limits,
        rules=rules or JobRules(),
        poll=POLL_S,
        # Crashes and hangs are injected on purpose (a campaign injects dozens): the failure
        # budget is not what a benchmark measures, so it never ends the run.
        max_failures=10_000,
        ready_deadline=300.0,
        backoff_base=1.0,
        capacity_backoff=1.0,
    )


@dataclass
class RunRecord:
    """What a run leaves behind, all JSON-able."""

    trainer_args: str
    workers: int
    started: float  # before pod.up
    ready: float  # the first slice READY
    finished: float
    exit: str  # "done", "stopped" (Stop) or "watch exited N"
    events: list[dict] = field(default_factory=list)  # the journal
    injected: list[dict] = field(default_factory=list)
    sampled: dict = field(default_factory=dict)  # Sampler.record()
    summary: dict | None = None  # the job's summary.json
    reference: dict | None = None  # the uninterrupted run's summary.json
    reference_wall_s: float | None = None
    references: dict = field(default_factory=dict)  # other references: name -> summary, wall
    checks: dict = field(default_factory=dict)  # what `after` found on the pod before teardown

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, asdict(self))
        return path

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        return cls(**json.loads(Path(path).read_text()))


def run_on_pod(
    pod_dir: Path,
    trainer_args: str,
    schedule_kwargs: dict,
    *,
    workers: int = 2,
    notice: float = 30.0,
    reference: bool = False,
    reference_timeout: float = 3600.0,
    console: Console | None = None,
    hang: float = 30.0,
    references: tuple[str, ...] = ("reference-none",),
    after=None,
    job=None,
    warm: bool = False,
    pod_options: dict | None = None,
    storage_faults: dict | None = None,
) -> RunRecord:
    """Runs the job (the built-in trainer's with `trainer_args`, or `job`, an contract.job.Job)
    under watch with a `bench.faults.Schedule(**schedule_kwargs)`; with `reference`, then the
    uninterrupted "reference" and `references` (built-in trainer only); `after(pod)` (its result
    in `checks`) runs on the pod before it goes; `warm`: no fault before the job's environment
    is published (its bytecode in the bucket, as hours of a real run leave it by the first
    preemption); `pod_options`: more LocalPod keywords (create_via); `storage_faults`: a
    localpod.gcp.storage_faults plan for the bucket once the pod is up. The pod is always torn
    down, whatever happens."""
    from demo.reference import read_object
    from localpod.pod import LocalPod

    console = console or Console()
    pod = LocalPod(
        pod_dir,
        workers=workers,
        job=job,
        **({"trainer_args": trainer_args} if trainer_args else {}),
        **(pod_options or {}),
    )
    trainer_args = trainer_args or pod.job.source
    sampler = Sampler(pod.paths.root, workers)
    started = time.time()
    journal = schedule = None
    try:
        with console.status(f"bringing up a {workers}-worker local pod") as status:
            pod.up(progress=status.update)
        if storage_faults:  # the bucket fails a share of requests from here to the end
            pod.storage_faults(storage_faults)
        ready = time.time()
        journal_file = pod.paths.root / "journal.jsonl"
        journal_file.unlink(missing_ok=True)
        journal = Journal(journal_file, console)
        sampler.start()
        ready = (lambda: bytecode_published(pod)) if warm else None
        schedule = Schedule(pod, notice=notice, ready=ready, **schedule_kwargs)
        config = watch_config(notice, hang, JobRules.of(pod.job.spec))
        outcome = watch_until_end(pod, journal, schedule, config)
        finished = time.time()
        summary = (
            read_object(pod.paths.root, f"{pod.run_prefix}/summary.json")
            if code_ok(outcome)
            else None
        )
        record = RunRecord(
            trainer_args,
            workers,
            started,
            ready,
            finished,
            outcome,
            injected=schedule.injected,
            summary=summary,
        )
        if reference and code_ok(outcome):
            record.reference, record.reference_wall_s = run_reference(
                pod, trainer_args, reference_timeout, console
            )
            for name in references:
                ref, wall = run_reference(pod, trainer_args, reference_timeout, console, name)
                record.references[name] = {"summary": ref, "wall_s": wall}
        if after is not None:
            record.checks = after(pod)
        sampler.stop()
        record.events = list(journal.events)
        record.sampled = sampler.record()
        return record
    except BaseException:
        if journal is not None:  # keep what an interrupted run measured, for a look afterwards
            injected = schedule.injected if schedule else []
            events = list(journal.events)
            partial = RunRecord(trainer_args, workers, started, started, time.time(),
                                "interrupted", events, injected, sampler.record())  # fmt: skip
            partial.save(pod_dir.with_name(f"{pod_dir.name}-partial.json"))
        raise
    finally:
        try:
            sampler.stop()
        finally:
            with console.status("tearing the pod down"):
                pod.down()


def watch_until_end(pod, journal: Journal, schedule: Schedule, config) -> str:
    """The real watch loop with the schedule as its on_poll hook; a watch the schedule kills
    (WatchKilled) is replaced by a new one that goes on from the same incident.json."""
    from demo.reference import pod_provider

    provider = pod_provider(pod.paths.root)
    store = IncidentStore(pod.paths.root / "incident.json")
    store.clear()
    while True:
        watcher = Watcher(provider, journal, config, on_poll=schedule, store=store)
        try:
            code = watcher.run()
            return "done" if code == 0 else f"watch exited {code}"
        except WatchKilled as why:
            journal.event("watch_killed", f"{why}; a new watch goes on from incident.json")
        except Stop as why:
            journal.event("stopped", f"benchmark schedule complete: {why}")
            return "stopped"


def bytecode_published(pod) -> bool:
    """Some venv's bytecode archive is in the pod's bucket (trainer/bytecode.py)."""
    import urllib.parse
    import urllib.request

    url = pod.describe().pod["emulator_url"]
    prefix = urllib.parse.quote(f"compile-cache/{pod.stack}/bytecode/", safe="")
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b/{pod.bucket}/o?prefix={prefix}",
                                    timeout=10) as r:  # fmt: skip
            return bool(json.loads(r.read()).get("items"))
    except (OSError, ValueError):
        return False


def code_ok(outcome: str) -> bool:
    return outcome == "done"


# Uninterrupted references: the job's own job.env, a fresh workdir, its own status file, the
# built-in trainer with the job's arguments. "reference" keeps the job's checkpoint policy (the
# goodput headline's yardstick); "reference-none" saves nothing (checkpoint overhead =
# reference / reference-none).
REFERENCES = {"reference": "", "reference-none": "--set checkpoint_every=0"}
REFERENCE_SCRIPT = (
    'R="$TPUPOD_ROOT"; cd -P "$R/current" && '
    'while IFS=\'=\' read -r k v; do export "$k=$v"; done < "$R/job.env" && '
    'export TPUPOD_WORKDIR="gs://{bucket}/runs/{stack}/{name}" '
    'TPUPOD_STATUS_FILE="$R/{name}-status.json" && '
    '.venv/bin/python -m trainer {args} {extra} > "$R/{name}.log" 2>&1'
)


@contextlib.contextmanager
def observed(provider, workers) -> Iterator[dict[str, int]]:
    """What a watch poll costs the pod, every POLL_S while the block runs: the slice's
    describe and one probe of every worker over SSH. On this pod the watcher, the SSH servers
    and the trainers share 2 cores (about 5 % of the trainers' step rate), so a reference
    without it would charge the faulted run's watch to its faults. Yields the poll counts: a
    poll that fails adds less load, so the caller reports them."""
    from ops.fleet.workers import WorkerGroup

    stop = threading.Event()
    counts = {"polls": 0, "failed": 0}

    def poll() -> None:
        with WorkerGroup(workers, retries=0) as group:
            while not stop.wait(POLL_S):
                counts["polls"] += 1
                try:
                    provider.describe()
                    group.probe()
                except Exception:  # noqa: BLE001 - load only: counted, never a result
                    counts["failed"] += 1

    thread = threading.Thread(target=poll, name="reference-observer", daemon=True)
    thread.start()
    try:
        yield counts
    finally:
        stop.set()
        thread.join(timeout=30)


def run_reference(
    pod,
    trainer_args: str,
    timeout: float,
    console: Console,
    name: str = "reference",
    extra: str | None = None,
) -> tuple[dict | None, float]:
    """One uninterrupted reference run of `python -m trainer TRAINER_ARGS` on every worker (as
    root, like the job), observed as the watch observes the faulted run: its summary.json
    (final step, fingerprint) and its wall time. Its own workdir, runs/<stack>/<name> (under the
    stack's prefix: the workers may write nowhere else); `extra` (default:
    REFERENCES[name]) follows the job's arguments, so its --steps and --set win."""
    from demo.reference import pod_provider, read_object
    from ops.fleet.workers import WorkerGroup, as_root

    bucket = json.loads((pod.paths.root / "endpoints.json").read_text())["bucket"]
    extra = REFERENCES[name] if extra is None else extra
    script = REFERENCE_SCRIPT.format(bucket=bucket, stack=pod.stack, name=name, args=trainer_args,
                                     extra=extra)  # fmt: skip
    provider = pod_provider(pod.paths.root)
    workers = provider.describe().workers
    started = time.time()
    with (
        console.status(f"uninterrupted {name} run (same trainer.env, fresh workdir, watched)"),
        WorkerGroup(workers, retries=0) as group,
        observed(provider, workers) as polls,
    ):
        outcomes = group.run(as_root(script), timeout=timeout)
    wall = time.time() - started
    console.print(f"{name}: observed by {polls['polls']} polls ({polls['failed']} failed)")
    bad = [o for o in outcomes.values() if not o.ok]
    if bad:
        console.print(f"{name} run failed on worker {bad[0].index} (exit {bad[0].exited})")
        return None, wall
    return read_object(pod.paths.root, f"runs/{pod.stack}/{name}/summary.json"), wall
