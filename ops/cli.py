"""`tpupod`: the operator's command line. Each feature module registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules exposing `register(subparsers)`; each adds its subcommands with `set_defaults(func=...)`.
COMMAND_MODULES: list[str] = ["localpod.cli", "ops.commands"]


class CliError(Exception):
    """Bad input or an impossible request: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpupod",
        description="Self-healing spot TPU training: watch a slice, recover it after preemptions, "
        "crashes and hangs, and resume from the latest checkpoint. Slices are declared with "
        "`pulumi up --stack NAME`; `--stack local` is a slice on this machine.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except CliError as err:
        print(f"tpupod: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tpupod: interrupted", file=sys.stderr)
        return 130
