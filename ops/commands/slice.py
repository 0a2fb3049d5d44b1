"""`tpupod status|logs|watch`: the operator's commands, for any provider."""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
from pathlib import Path

from rich.console import Console

from contract.job import JobSpec
from infra import cleanup
from ops.cli import CliError
from ops.cloud import providers
from ops.cloud.slice import Provider, ProviderError, SliceInfo, SliceState
from ops.cloud.target import LOCAL, load_target, state_dir
from ops.commands.tables import owned_table, run_line, slice_table, worker_table
from ops.fleet.workers import ROOT as REMOTE_ROOT
from ops.fleet.workers import WorkerGroup
from ops.watch import WatchConfig
from ops.watch.deadlines import config_for

# Per-provider defaults: a CPU pod compiles and boots in seconds, a TPU slice in minutes.
# `stall` is a job's hang_after_s where it sets none, `start` its startup_timeout_s.
LOG_FILES = {"job": "job.log", "bootstrap": "bootstrap.log"}


def provider_for(args: argparse.Namespace) -> Provider:
    """The provider of the target `--stack` (and `--pod-dir` / `--spec`) names."""
    try:
        target = load_target(
            args.stack,
            pod_dir=getattr(args, "pod_dir", None),
            spec_file=getattr(args, "spec", None),
            cache_dir=state_dir_for(args),
        )
    except ProviderError as err:
        raise CliError(str(err)) from None
    return providers.provider_for(target)


def state_dir_for(args: argparse.Namespace) -> Path:
    """The journal's directory: the incident and the cached stack outputs live beside it."""
    journal = getattr(args, "journal", None)
    return Path(journal).parent if journal else state_dir(args.stack)


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
def cmd_status(args: argparse.Namespace) -> int:
    provider = provider_for(args)
    info = describe(provider)
    console = Console()
    console.print(slice_table(info, title=f"stack {args.stack}"))
    if args.all:
        console.print(owned_table(owned(provider), provider.zones, args.stack))
    from ops.watch.remote_watch import restart_lines, watcher_lines  # lease, journal (bucket)

    for line in watcher_lines(provider) + restart_lines(provider):
        console.print(line, markup=False, highlight=False)
    if info.state is SliceState.READY and info.workers:
        with WorkerGroup(info.workers, retries=1) as group:
            probes = group.probe()
        console.print(run_line(provider.target, probes), markup=False, highlight=False)
        console.print(worker_table(info, probes))
    return 0


def owned(provider: Provider) -> list[cleanup.Owned]:
    """Every node and queued resource labelled with the stack, in each of tpupod:zones: what
    `pulumi destroy --run-program` deletes (infra.cleanup)."""
    try:
        return provider.owned()
    except cleanup.CleanupError as err:
        raise CliError(str(err)) from None


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


def print_attempt_logs(args: argparse.Namespace) -> int:
    """`logs --attempt N`: that attempt's output of every worker, from the bucket."""
    from ops.watch.remote_watch import attempt_logs

    try:
        logs = attempt_logs(provider_for(args), args.attempt, args.worker)
    except ProviderError as err:
        raise CliError(str(err)) from None
    for uri, text in logs:
        lines = text.splitlines()[-args.lines :] if args.lines else text.splitlines()
        worker = uri.rsplit("worker-", 1)[-1].removesuffix(".log")
        for line in lines:
            print(f"[w{worker}] {line}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    if getattr(args, "attempt", None) is not None:  # from the bucket: the VM may be gone
        return print_attempt_logs(args)
    if getattr(args, "watcher", False):
        from ops.watch.remote_watch import follow_journal

        try:
            return follow_journal(provider_for(args), args.lines, args.follow, Console())
        except ProviderError as err:
            raise CliError(str(err)) from None
    if getattr(args, "incident", None) is not None:  # beside the journal, else in the bucket
        from ops.fleet.forensics import show

        def bucket():  # opened only when the journal's directory has no such incident
            from ops.watch.remote_state import RemoteState

            return RemoteState.for_target(provider_for(args).target)

        try:
            print(show(state_dir_for(args), args.incident, bucket))
        except FileNotFoundError as err:
            raise CliError(str(err)) from None
        return 0
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


# -- watch ----------------------------------------------------------------------------------------
def watch_config(args: argparse.Namespace, job: JobSpec | None = None) -> WatchConfig:
    """The profile of where the stack runs, the job's spec, and the flags given, in that order."""
    profile = LOCAL if args.stack == LOCAL else "gcp"
    return config_for(profile, job, poll=args.poll, hang=args.hang_timeout,
                      stall=args.stall_timeout, max_failures=args.max_failures,
                      backoff=args.backoff)  # fmt: skip


def journal_path(args: argparse.Namespace) -> Path:
    return Path(args.journal) if args.journal else state_dir(args.stack) / "journal.jsonl"


def cmd_watch(args: argparse.Namespace) -> int:
    provider = provider_for(args)
    describe(provider)  # an unknown or undeployed stack fails here, in one line
    console = Console()
    path = journal_path(args)
    from ops.watch.remote_watch import watch_with_lease  # journal, incident and lease in the bucket

    try:
        config = watch_config(args, provider.target.job())
        return watch_with_lease(
            provider, config, path, console,
            holder=args.holder, ttl=args.lease_ttl, observe_only=args.observe,
        )  # fmt: skip
    except ProviderError as err:
        raise CliError(str(err)) from None


def stack_options() -> argparse.ArgumentParser:
    """--stack, --spec, --pod-dir: the options of every command that acts on a slice."""
    stack = argparse.ArgumentParser(add_help=False)
    stack.add_argument(
        "--stack",
        default=os.environ.get("TPUPOD_STACK", LOCAL),
        help="Pulumi stack (stacks/Pulumi.<stack>.yaml) or `local` [$TPUPOD_STACK, local]",
    )
    stack.add_argument(
        "--spec",
        type=Path,
        help="the stack's node spec (`pulumi stack output node_spec --json`), where there is "
        "no Pulumi CLI; read once from Pulumi and cached otherwise",
    )
    stack.add_argument(
        "--pod-dir", type=Path, help="the local pod's directory [$TPUPOD_POD_DIR, .tpupod]"
    )
    return stack


def register(subparsers: argparse._SubParsersAction) -> None:
    stack = stack_options()
    status = subparsers.add_parser(
        "status", parents=[stack],
        help="slice state, the run (id, attempt, step of steps), every worker's job, the restarts",
    )  # fmt: skip
    status.add_argument(
        "--all", action="store_true",
        help="also every node and queued resource the stack owns, in every zone, with its state",
    )  # fmt: skip
    status.set_defaults(func=cmd_status)

    logs = subparsers.add_parser("logs", parents=[stack], help="worker logs, prefixed by worker")
    logs.add_argument("--worker", type=int, help="only this worker")
    logs.add_argument("--follow", "-f", action="store_true", help="keep following")
    logs.add_argument("--lines", "-n", type=int, default=50, help="lines from the end")
    logs.add_argument("--file", choices=sorted(LOG_FILES), default="job")
    logs.add_argument(
        "--attempt", type=int,
        help="attempt N's output from every worker, from the bucket (also after its VM is gone)",
    )  # fmt: skip
    logs.add_argument(
        "--watcher", action="store_true", help="the watcher's journal (from the bucket)"
    )
    logs.add_argument(
        "--incident",
        type=int,
        help="hang forensics of incident N (stacks + log tail, per worker; from beside the journal, "
        "else from the bucket, where the watcher VM keeps them)",
    )
    logs.set_defaults(func=cmd_logs)

    watch = subparsers.add_parser(
        "watch", parents=[stack], help="recover from preemptions, crashes and hangs until done"
    )
    watch.add_argument("--hang-timeout", type=float, help="heartbeat age (s) that is a hang")
    watch.add_argument("--stall-timeout", type=float, help="seconds without a new step: a hang")
    watch.add_argument(
        "--max-failures", type=int, help="failure restarts allowed [the job's max_restarts, 3]"
    )
    watch.add_argument("--poll", type=float, default=0.5, help="seconds between observations")
    watch.add_argument(
        "--backoff",
        type=float,
        help="seconds before a failure restart that follows another with no newer checkpoint "
        "between (a crash loop), doubling; the first restart goes at once [the job's backoff_s]",
    )
    watch.add_argument(
        "--holder", help="lease holder id (a service sets a stable one) [$TPUPOD_WATCH_HOLDER]"
    )
    watch.add_argument("--lease-ttl", type=float, help="seconds a lease lives unrenewed")
    watch.add_argument(
        "--observe", action="store_true", help="never act: print the acting watcher's journal"
    )
    watch.add_argument(
        "--journal",
        help="JSON-lines journal; incident.json goes beside it [.tpupod/ops/STACK/journal.jsonl]",
    )
    watch.set_defaults(func=cmd_watch)
