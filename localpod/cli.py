"""`tpupod local ...` (up, down, preempt, crash, hang) and `slice_table`, the slice part of `tpupod status`.

`slice_table` builds the status table from an `ops.provider.SliceInfo`, so the ops `status`
command can reuse it for any provider.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from localpod.pod import LocalPod
from localpod.state import PodError
from ops.cli import CliError
from ops.provider import SliceInfo, SliceState
from ops.providers.local import LocalProvider

_STATE_STYLE = {
    SliceState.READY: "green",
    SliceState.CREATING: "yellow",
    SliceState.DELETING: "yellow",
    SliceState.PREEMPTED: "red",
    SliceState.TERMINATED: "red",
}


def slice_table(info: SliceInfo, title: str = "slice") -> Table:
    """Slice state and health in the title, one row per worker endpoint."""
    style = _STATE_STYLE.get(info.state, "white")
    health = f", {info.health}" if info.health else ""
    detail = f" ({info.detail})" if info.detail else ""
    table = Table(title=f"{title}: [{style}]{info.state}[/{style}]{health}{detail}")
    for column in ("worker", "host", "ssh port", "user", "key"):
        table.add_column(column)
    for w in info.workers:
        table.add_row(str(w.index), w.host, str(w.port), w.user or "", w.key_filename or "")
    return table


def _pod(args: argparse.Namespace, **kwargs) -> LocalPod:
    return LocalPod(getattr(args, "pod_dir", None), **kwargs)


def _up(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.workers > 250:
        raise CliError("--workers must be between 1 and 250")
    script = args.startup_script
    if script is not None and not script.is_file():
        raise CliError(f"--startup-script {script}: no such file")
    pod = _pod(
        args,
        workers=args.workers,
        devices_per_worker=args.devices_per_worker,
        startup_script=script,
        trainer_args=f"--config {args.preset} --steps {args.steps}",
    )
    console = Console()
    started = time.monotonic()
    try:
        with console.status("starting the local pod") as status:
            pod.up(progress=lambda message: status.update(message))
    except PodError as err:
        raise CliError(str(err)) from None
    console.print(slice_table(LocalProvider(pod).describe(), title=f"local pod ({pod.paths.root})"))
    console.print(
        f"up in {time.monotonic() - started:.1f} s; workers are booting (startup-script)."
    )
    console.print(
        f"boot logs: {pod.paths.root}/workers/<i>/startup-script.log; next: tpupod status, "
        "tpupod local preempt|crash|hang, tpupod local down"
    )
    return 0


def _call(args: argparse.Namespace, action) -> int:
    try:
        result = action(_pod(args))
    except PodError as err:
        raise CliError(str(err)) from None
    if result is not None:
        Console().print(result)
    return 0


def _down(args: argparse.Namespace) -> int:
    pod = _pod(args)
    if not pod.down():
        raise CliError(f"no local pod is up in {pod.paths.root}")
    print(f"local pod in {pod.paths.root} is down")
    return 0


def _preempt(args: argparse.Namespace) -> int:
    if args.notice < 0:
        raise CliError("--notice must be >= 0")

    def preempt(pod: LocalPod) -> str:
        info = pod.preempt(notice=args.notice, wait=not args.no_wait)
        return f"slice {info.state} (notice {args.notice:g} s)"

    return _call(args, preempt)


def _crash(args: argparse.Namespace) -> int:
    return _call(args, lambda pod: f"worker {args.worker}: trainer {pod.crash(args.worker)} killed")


def _hang(args: argparse.Namespace) -> int:
    return _call(args, lambda pod: f"worker {args.worker}: trainer {pod.hang(args.worker)} stopped")


def register(subparsers: argparse._SubParsersAction) -> None:
    pod_dir = argparse.ArgumentParser(add_help=False)
    pod_dir.add_argument("--pod-dir", type=Path, help=argparse.SUPPRESS)

    local = subparsers.add_parser(
        "local", help="the local pod: a TPU slice simulated on this machine"
    )
    sub = local.add_subparsers(dest="local_command", metavar="ACTION", required=True)

    up = sub.add_parser("up", parents=[pod_dir], help="start the pod; returns once it is READY")
    up.add_argument("--workers", type=int, default=2, help="workers (hosts) in the slice")
    up.add_argument("--preset", default="tiny", help="trainer config preset")
    up.add_argument("--steps", type=int, default=200, help="training steps")
    up.add_argument("--devices-per-worker", type=int, default=2, help="CPU devices per worker")
    up.add_argument("--startup-script", type=Path, help=argparse.SUPPRESS)
    up.set_defaults(func=_up)

    sub.add_parser("down", parents=[pod_dir], help="stop everything the pod started").set_defaults(
        func=_down
    )

    preempt = sub.add_parser("preempt", parents=[pod_dir], help="preempt the slice like GCE")
    preempt.add_argument("--notice", type=float, default=30.0, help="seconds from SIGTERM to KILL")
    preempt.add_argument("--no-wait", action="store_true", help="return before PREEMPTED")
    preempt.set_defaults(func=_preempt)

    for name, func, what in (("crash", _crash, "SIGKILL"), ("hang", _hang, "SIGSTOP")):
        parser = sub.add_parser(name, parents=[pod_dir], help=f"{what} a worker's trainer")
        parser.add_argument("--worker", type=int, required=True, help="worker index")
        parser.set_defaults(func=func)
