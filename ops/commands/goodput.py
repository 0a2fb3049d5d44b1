"""`tpupod goodput`: a run's goodput (productive time over wall time, Google's definition) and
its badput by category, from the watcher's journal: the bucket's copy (`ops/<stack>/journal/`,
where the watcher VM writes it) or a journal file (`--journal`). Operator side only: it reads
what the watcher already keeps, and the workers run nothing more for it. How each category is
computed: ops.watch.goodput."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ops.cli import CliError
from ops.cloud.slice import ProviderError
from ops.cloud.storage_errors import STORAGE_ERRORS
from ops.commands.slice import provider_for, stack_options
from ops.watch import journal as journal_file
from ops.watch.goodput import CATEGORIES, Goodput, measure
from ops.watch.remote_state import RemoteState


def records_of(args: argparse.Namespace, console: Console) -> list[dict]:
    if args.journal is not None:
        if not args.journal.is_file():
            raise CliError(f"--journal {args.journal}: no such file (the watcher's --journal)")
        return journal_file.read(args.journal)
    try:
        state = RemoteState.for_target(provider_for(args).target)
        with console.status("reading the watcher's journal from the bucket (one object an event)"):
            return [record for _, record in state.read_journal()]
    except (ProviderError, *STORAGE_ERRORS) as err:
        raise CliError(
            f"the watcher's journal is unreadable: {' '.join(str(err).split())[:200]}"
        ) from None


def table(result: Goodput) -> Table:
    out = Table(title="badput by category (seconds; they add up to the wall time)")
    out.add_column("category")
    out.add_column("seconds", justify="right")
    out.add_column("share", justify="right")
    for name in CATEGORIES:
        seconds = result.seconds[name]
        share = f"{seconds / result.wall_s:.1%}" if result.wall_s else "-"
        out.add_row(name, f"{seconds:.0f}", share)
    return out


def cmd_goodput(args: argparse.Namespace) -> int:
    console = Console()
    result = measure(records_of(args, console), time.time())
    if args.json:
        doc = {"goodput": result.goodput, "wall_s": result.wall_s, "step_s": result.step_s,
               "final_step": result.final_step, "incidents": result.incidents,
               "finished": result.finished, "seconds": result.seconds}  # fmt: skip
        print(json.dumps(doc, indent=1, sort_keys=True))
        return 0
    if result.wall_s <= 0:
        console.print("no watcher journal events yet: start `tpupod watch` (or the watcher VM)")
        return 1
    state = "done" if result.finished else "still running"
    console.print(table(result))
    if result.goodput is None:
        console.print(f"goodput: not yet known ({state}; the step time needs two progress "
                      "samples a minute apart with no incident between)")  # fmt: skip
        return 0
    console.print(f"goodput {result.goodput:.1%} over {result.wall_s / 60:.1f} min ({state}): "
                  f"step {result.final_step} at {result.step_s:.3g}s a step, "
                  f"{result.incidents} incidents")  # fmt: skip
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "goodput", parents=[stack_options()],
        help="a run's goodput (productive / wall time) and badput by category, from the "
             "watcher's journal",
        description=__doc__,
    )  # fmt: skip
    p.add_argument("--journal", type=Path,
                   help="a journal file (`tpupod watch --journal`) instead of the bucket's copy")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=cmd_goodput)
