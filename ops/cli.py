"""`tpupod`: the operator's command line. Each feature module registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules exposing `register(subparsers)`; each adds its subcommands with `set_defaults(func=...)`.
# A module may also expose `USER_ERRORS`, exception types that mean bad input or an impossible
# request (printed as one line, exit 2), so that localpod needs nothing from ops.
COMMAND_MODULES: list[str] = [
    "localpod.cli",
    "ops.commands",
    "ops.run_control",
    "ops.job_check",
    "ops.checkpoints",
]


class CliError(Exception):
    """Bad input or an impossible request: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpupod",
        description="Self-healing spot TPU training: watch a slice, recover it after preemptions, "
        "crashes and hangs through the Cloud TPU API, and resume from the latest checkpoint. "
        "Slices are declared with "
        "`pulumi up --stack NAME`; `--stack local` is a slice on this machine.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def user_errors() -> tuple[type[Exception], ...]:
    """CliError plus every command module's USER_ERRORS."""
    found: list[type[Exception]] = [CliError]
    for name in COMMAND_MODULES:
        found.extend(getattr(importlib.import_module(name), "USER_ERRORS", ()))
    return tuple(found)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except user_errors() as err:
        print(f"tpupod: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tpupod: interrupted", file=sys.stderr)
        return 130
