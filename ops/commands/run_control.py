"""`tpupod stop|start|restart|rollout`: the operator's hand on a run, on every worker at once.

`stop` holds the run first (`ops/<stack>/hold.json` in the bucket: a running watcher, on its VM or
anywhere, then watches without acting) and then stops the job on every worker, SIGTERM and its
`grace_s` to save; `start` starts the job as the next attempt and then lifts the hold (in that
order: a watcher never sees the stopped job unheld); `restart` is stop + start of the job
without a hold. Each new start is the next attempt of the same run: same
run id, same checkpoint directory, resumed from the job's latest checkpoint. `rollout` puts the
bundle the node's metadata names (after `pulumi up`) on workers that run another, under a hold:
the job saves and stops, every worker's startup script runs again (fetch, verify, sync, start).
"""

from __future__ import annotations

import argparse
import getpass
import socket
import time

from rich.console import Console

from ops.cli import CliError
from ops.cloud.slice import Provider, ProviderError, SliceState
from ops.cloud.storage_errors import STORAGE_ERRORS
from ops.commands.slice import provider_for, ready_workers, stack_options
from ops.fleet.starts import starts
from ops.fleet.workers import STOP_AND_CLEAR, WorkerError, WorkerGroup
from ops.watch.deadlines import GCP
from ops.watch.remote_state import RemoteState


def next_attempt(group: WorkerGroup) -> int:
    """One more than the newest attempt any worker ran."""
    return max((p.attempt or 0 for p in group.probe()), default=0) + 1


def restart_job(group: WorkerGroup, console: Console, start: bool = True) -> int | None:
    """stop and clear-locks on every worker[, then start-all as the next attempt]; the
    attempt started."""
    attempt = next_attempt(group) if start else None
    verbs = (STOP_AND_CLEAR, "start") if start else (STOP_AND_CLEAR,)
    try:
        for verb in verbs:
            began = time.time()
            outcomes = group.jobctl(
                verb,
                timeout=900.0,
                attempt=attempt if verb == "start" else None,
                keep_standby=start,
            )  # a restart's stop keeps the parked attempt
            label = verb.replace(" ", " + ")  # "stop + clear-locks": one round trip
            how = starts(outcomes).text() if verb == "start" else ""
            console.print(f"{label:<12} every worker ({time.time() - began:.1f}s){how}")
    except WorkerError as err:
        raise CliError(str(err)) from None
    return attempt


def bucket_state(provider: Provider) -> RemoteState:
    try:
        state = RemoteState.for_target(provider.target)
        state.check()
    except ProviderError as err:
        raise CliError(str(err)) from None
    return state


def cmd_stop(args: argparse.Namespace) -> int:
    provider = provider_for(args)
    state = bucket_state(provider)
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    try:
        state.write_hold({"by": who, "at": time.time(), "reason": args.reason or "tpupod stop"})
    except STORAGE_ERRORS as err:
        raise CliError(
            f"cannot write the hold to gs://{state.bucket.name}/{state.prefix}: {err}"
        ) from None
    console = Console()
    console.print(f"run held in gs://{state.bucket.name}/{state.prefix}hold.json: the watcher "
                  "takes no action until `tpupod start`")  # fmt: skip
    info = provider.describe()
    if info.state is SliceState.READY and info.workers:
        with WorkerGroup(info.workers) as group:
            restart_job(group, console, start=False)
        console.print("job stopped on every worker (SIGTERM, then SIGKILL after its grace_s)")
    else:
        console.print(f"slice {info.state}: no job to stop; it stays stopped until `tpupod start`")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    provider = provider_for(args)
    state = bucket_state(provider)
    console = Console()
    info = provider.describe()
    if info.state is not SliceState.READY or not info.workers:
        state.clear_hold()
        console.print(f"hold lifted; slice {info.state}: the watcher recreates it and the job "
                      "starts at boot")  # fmt: skip
        return 0
    with WorkerGroup(info.workers) as group:
        attempt = restart_job(group, console)
    what = "; hold lifted" if state.clear_hold() else ""
    console.print(f"job started on every worker as attempt {attempt}{what}; it resumes from "
                  "its latest checkpoint")  # fmt: skip
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    info = ready_workers(provider_for(args))
    console = Console()
    with WorkerGroup(info.workers) as group:
        attempt = restart_job(group, console)
    console.print(f"job restarted on every worker as attempt {attempt}; it resumes from its "
                  "latest checkpoint")  # fmt: skip
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    provider = provider_for(args)
    info = ready_workers(provider)
    want = info.bundle
    if not want:
        raise CliError(f"node {provider.name} names no bundle (metadata tpupod-bundle-sha256): "
                       "deploy the stack with `pulumi up` first")  # fmt: skip
    console = Console()
    with WorkerGroup(info.workers) as group:
        stale = {p.index: p.bootstrap_bundle for p in group.probe() if p.bootstrap_bundle != want}
        if not stale:
            console.print(f"every worker runs bundle {want[:12]}: nothing to roll out")
            return 0
        old = ", ".join(sorted({(b or "none")[:12] for b in stale.values()}))
        state = bucket_state(provider)
        if held := state.read_hold():  # someone stopped the run: not ours to start again
            raise CliError(f"the run is held by {held.get('by', 'someone')} "
                           f"({held.get('reason', 'tpupod stop')}): `tpupod start` first")  # fmt: skip
        who = f"{getpass.getuser()}@{socket.gethostname()}"
        state.write_hold({"by": who, "at": time.time(), "reason": "tpupod rollout"})
        began = time.time()
        try:
            with console.status("stopping the job (it saves), then the startup script"):
                group.roll_out(GCP["bootstrap"])
        except WorkerError as err:
            raise CliError(f"rollout of bundle {want[:12]}: {err}; the run stays held "
                           "(`tpupod start` lifts it)") from None  # fmt: skip
        state.clear_hold()
    console.print(f"bundle {want[:12]} rolled out (was {old}) in {time.time() - began:.1f}s; "
                  "the job resumes from the checkpoint it saved on stopping")  # fmt: skip
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    stack = stack_options()
    stop = subparsers.add_parser(
        "stop", parents=[stack],
        help="hold the run (the watcher does not undo it) and stop the job on every worker",
    )  # fmt: skip
    stop.add_argument("--reason", help="why, shown to whoever looks (tpupod status)")
    stop.set_defaults(func=cmd_stop)
    subparsers.add_parser(
        "start", parents=[stack],
        help="lift a hold and start the job on every worker as the next attempt",
    ).set_defaults(func=cmd_start)  # fmt: skip
    subparsers.add_parser(
        "restart", parents=[stack],
        help="stop, clear locks and start the job on every worker (the next attempt)",
    ).set_defaults(func=cmd_restart)  # fmt: skip
    subparsers.add_parser(
        "rollout", parents=[stack],
        help="put the bundle the node names (after `pulumi up`) on every worker at a checkpoint "
        "boundary, without recreating the slice",
    ).set_defaults(func=cmd_rollout)  # fmt: skip
