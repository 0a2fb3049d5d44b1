"""`tpupod`: the operator's command line. Each feature module registers its own subcommands.

The product's commands are listed here. Others come from the `tpupod.commands` entry point group:
the test bed (`localpod`: `tpupod local ...`, `tpupod demo`) declares its own in pyproject.toml,
so nothing in the product names it, and a machine without it (a watcher VM runs `tpupod watch`
from the bundle, which does not carry the test bed) simply has no such commands.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from importlib.metadata import entry_points
from types import ModuleType

# Modules exposing `register(subparsers)`; each adds its subcommands with `set_defaults(func=...)`.
# A module may also expose `USER_ERRORS`, exception types that mean bad input or an impossible
# request (printed as one line, exit 2), so that a plugin needs nothing from this module.
COMMAND_MODULES: list[str] = [
    "ops.commands.slice",
    "ops.commands.run_control",
    "ops.commands.job_check",
    "ops.commands.checkpoints",
    "ops.commands.goodput",
]
PLUGIN_GROUP = "tpupod.commands"


class CliError(Exception):
    """Bad input or an impossible request: printed as one line, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusals (unknown command or flag, a bad value) as one line, exit 2, naming
    the --help that shows the usage instead of printing it. Subcommands' parsers are of this
    class too (add_subparsers makes them of its parser's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tpupod",
        description="Self-healing spot TPU training: watch a slice, recover it after preemptions, "
        "crashes and hangs through the Cloud TPU API, and resume from the latest checkpoint. "
        "Slices are declared with "
        "`pulumi up --stack NAME`; `--stack local` is a slice on this machine.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in command_modules():
        module.register(sub)
    return parser


@functools.cache
def command_modules() -> tuple[ModuleType, ...]:
    """The product's command modules, then every installed plugin's whose package is here
    (once per process: the parser and the error types both need them)."""
    modules = [importlib.import_module(name) for name in COMMAND_MODULES]
    for plugin in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            modules.append(plugin.load())
        except ModuleNotFoundError as err:  # declared, but its package is not on this machine
            if not plugin.value.startswith(f"{err.name}.") and plugin.value != err.name:
                raise
    return tuple(modules)


def user_errors() -> tuple[type[Exception], ...]:
    """CliError plus every command module's USER_ERRORS."""
    found: list[type[Exception]] = [CliError]
    for module in command_modules():
        found.extend(getattr(module, "USER_ERRORS", ()))
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
