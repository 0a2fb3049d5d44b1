"""`tpupod status|logs|restart|watch|demo`: the operator's commands, for any provider."""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ops.cli import CliError
from ops.journal import Journal
from ops.provider import Provider, ProviderError, SliceInfo, SliceState
from ops.providers import LOCAL, ROOT, get_provider
from ops.recovery import Limits, Probe
from ops.watch import WatchConfig, Watcher
from ops.workers import ROOT as REMOTE_ROOT
from ops.workers import WorkerError, WorkerGroup

# Per-provider defaults: a CPU pod compiles and boots in seconds, a TPU slice in minutes.
WATCH_DEFAULTS = {
    LOCAL: dict(hang=30.0, start=300.0, stall=400.0, bootstrap=600.0, ready=180.0, grace=30.0),
    "gcp": dict(hang=300.0, start=1800.0, stall=1800.0, bootstrap=1800.0, ready=1800.0, grace=60.0),
}
LOG_FILES = {"trainer": "trainer.log", "bootstrap": "bootstrap.log"}


def provider_for(args: argparse.Namespace) -> Provider:
    if args.stack == LOCAL:
        from ops.providers.local import LocalProvider

        return LocalProvider(pod_dir=getattr(args, "pod_dir", None))
    return get_provider(args.stack)


def describe(provider: Provider) -> SliceInfo:
    try:
        return provider.describe()
    except ProviderError as err:
        raise CliError(str(err)) from None


def ready_workers(provider: Provider) -> SliceInfo:
    info = describe(provider)
    if info.state is not SliceState.READY or not info.workers:
        raise CliError(f"slice {provider.name} is {info.state}: nothing to reach over SSH")
    return info


# -- status ---------------------------------------------------------------------------------------
def worker_table(info: SliceInfo, probes: list[Probe]) -> Table:
    """Per worker: bootstrap phase, trainer state, step, loss, tokens/s, checkpoint, heartbeat."""
    table = Table(
        title=f"workers: slice {info.state}" + (f", {info.health}" if info.health else "")
    )
    for column in ("worker", "bootstrap", "trainer", "step", "loss", "tok/s", "ckpt", "beat"):
        table.add_column(column, justify="left" if column in ("bootstrap", "trainer") else "right")
    for p in probes:
        if not p.reachable:
            table.add_row(str(p.index), "[red]unreachable[/red]", p.error or "", *[""] * 5)
            continue
        boot = p.bootstrap or {}
        s = p.status
        trainer = "-" if s is None else str(s.state)
        if p.exit_code is not None and not p.alive:
            trainer += f" (exit {p.exit_code})"
        state = boot.get("state", "-")
        table.add_row(
            str(p.index),
            state if state == "ok" else f"{state} ({boot.get('phase', '-')})",
            trainer,
            "-" if s is None else str(s.step),
            "-" if s is None or s.loss is None else f"{s.loss:.4f}",
            "-" if s is None or s.tokens_per_s is None else f"{s.tokens_per_s:,.0f}",
            "-" if s is None or s.last_checkpoint is None else str(s.last_checkpoint),
            "-" if p.heartbeat_age is None else f"{p.heartbeat_age:.1f}s ago",
        )
    return table


def _slice_table(info: SliceInfo, title: str) -> Table:
    try:  # the local pod engineer's table: slice state, health and endpoints
        from localpod.cli import slice_table
    except ImportError:
        return Table(title=f"{title}: {info.state}")
    return slice_table(info, title=title)


def cmd_status(args: argparse.Namespace) -> int:
    provider = provider_for(args)
    info = describe(provider)
    console = Console()
    console.print(_slice_table(info, title=f"stack {args.stack}"))
    if info.state is SliceState.READY and info.workers:
        with WorkerGroup(info.workers, retries=1) as group:
            console.print(worker_table(info, group.probe()))
    return 0


# -- logs -----------------------------------------------------------------------------------------
class _Prefixed:
    """A stream Fabric writes to: whole lines only, each prefixed with the worker."""

    def __init__(self, prefix: str, lock: threading.Lock):
        self.prefix, self.lock, self.buffer = prefix, lock, ""

    def write(self, data: str) -> None:
        self.buffer += data
        *lines, self.buffer = self.buffer.split("\n")
        with self.lock:
            for line in lines:
                print(f"{self.prefix} {line}", flush=True)

    def flush(self) -> None:
        pass


def cmd_logs(args: argparse.Namespace) -> int:
    info = ready_workers(provider_for(args))
    path = f'{REMOTE_ROOT}/"{LOG_FILES[args.file]}"'
    command = f"tail -n {args.lines} {'-F' if args.follow else ''} {path}"
    workers = [w for w in info.workers if args.worker is None or w.index == args.worker]
    if not workers:
        raise CliError(f"no worker {args.worker}: the slice has {len(info.workers)} workers")
    lock = threading.Lock()
    with WorkerGroup(workers, retries=1) as group:
        threads = []
        for w in workers:
            out = _Prefixed(f"[w{w.index}]", lock)
            cxn = group.connections[w.index]

            def tail(cxn=cxn, out=out):
                with contextlib.suppress(Exception):  # closed by Ctrl-C below
                    cxn.run(command, hide=False, warn=True, out_stream=out, err_stream=out)

            threads.append(threading.Thread(target=tail, daemon=True))
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        finally:
            group.close()
    return 0


# -- restart --------------------------------------------------------------------------------------
def cmd_restart(args: argparse.Namespace) -> int:
    info = ready_workers(provider_for(args))
    console = Console()
    with WorkerGroup(info.workers) as group:
        try:
            for verb in ("stop", "clear-locks", "start"):
                started = time.time()
                group.trainerctl(verb, timeout=300.0)
                console.print(f"{verb:<12} every worker ({time.time() - started:.1f}s)")
        except WorkerError as err:
            raise CliError(str(err)) from None
    console.print("trainer restarted on every worker; it resumes from the latest checkpoint")
    return 0


# -- watch ----------------------------------------------------------------------------------------
def watch_config(args: argparse.Namespace) -> WatchConfig:
    d = WATCH_DEFAULTS[LOCAL if args.stack == LOCAL else "gcp"]
    limits = Limits(
        hang=args.hang_timeout or d["hang"],
        start=d["start"],
        stall=args.stall_timeout or d["stall"],
        bootstrap=d["bootstrap"],
        preempt_grace=d["grace"],
    )
    return WatchConfig(
        limits=limits,
        poll=args.poll,
        max_failures=args.max_failures,
        ready_deadline=d["ready"],
        backoff_base=args.backoff,
    )


def journal_path(args: argparse.Namespace) -> Path:
    if args.journal:
        return Path(args.journal)
    return ROOT / ".tpupod" / "journals" / f"{args.stack}.jsonl"


def cmd_watch(args: argparse.Namespace) -> int:
    provider = provider_for(args)
    describe(provider)  # an unknown or undeployed stack fails here, in one line
    console = Console()
    path = journal_path(args)
    console.print(f"watching stack {args.stack}; journal {path}; Ctrl-C to stop", style="dim")
    watcher = Watcher(provider, Journal(path, console), watch_config(args))
    try:
        return watcher.run()
    except ProviderError as err:
        raise CliError(str(err)) from None


def cmd_demo(args: argparse.Namespace) -> int:
    from ops.demo import run_demo

    return run_demo(args)


def register(subparsers: argparse._SubParsersAction) -> None:
    stack = argparse.ArgumentParser(add_help=False)
    stack.add_argument(
        "--stack",
        default=os.environ.get("TPUPOD_STACK", LOCAL),
        help="Pulumi stack (stacks/Pulumi.<stack>.yaml) or `local` [$TPUPOD_STACK, local]",
    )
    stack.add_argument("--pod-dir", type=Path, help=argparse.SUPPRESS)

    status = subparsers.add_parser(
        "status", parents=[stack], help="slice state and every worker's trainer"
    )
    status.set_defaults(func=cmd_status)

    logs = subparsers.add_parser("logs", parents=[stack], help="worker logs, prefixed by worker")
    logs.add_argument("--worker", type=int, help="only this worker")
    logs.add_argument("--follow", "-f", action="store_true", help="keep following")
    logs.add_argument("--lines", "-n", type=int, default=50, help="lines from the end")
    logs.add_argument("--file", choices=sorted(LOG_FILES), default="trainer")
    logs.set_defaults(func=cmd_logs)

    subparsers.add_parser(
        "restart", parents=[stack], help="stop, clear locks and start the trainer on every worker"
    ).set_defaults(func=cmd_restart)

    watch = subparsers.add_parser(
        "watch", parents=[stack], help="recover from preemptions, crashes and hangs until done"
    )
    watch.add_argument("--hang-timeout", type=float, help="heartbeat age (s) that is a hang")
    watch.add_argument("--stall-timeout", type=float, help="seconds without a new step: a hang")
    watch.add_argument("--max-failures", type=int, default=3, help="failure restarts allowed")
    watch.add_argument("--poll", type=float, default=0.5, help="seconds between observations")
    watch.add_argument("--backoff", type=float, default=2.0, help="first backoff (s), doubling")
    watch.add_argument("--journal", help="JSON-lines journal [.tpupod/journals/STACK.jsonl]")
    watch.set_defaults(func=cmd_watch)

    demo = subparsers.add_parser(
        "demo", help="local pod: train, preempt, hang, recover; compare with an uninterrupted run"
    )
    demo.add_argument("--preset", default="tiny", help="trainer config preset")
    demo.add_argument("--steps", type=int, default=60, help="training steps")
    demo.add_argument("--pod-dir", type=Path, help=argparse.SUPPRESS)
    demo.set_defaults(func=cmd_demo)
