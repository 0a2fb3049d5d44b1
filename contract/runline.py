"""Which run lines a standby interpreter can stand in for (docs/proposals/standby-interpreter.md):
`[exec] (python|python3) (-m MODULE | SCRIPT.py) ARGS...` and nothing a shell would change.

A standby has imported the job's libraries before the job starts; at promotion it runs the
module or script in-process, exactly as `python -m MODULE ARGS` would. That is the same program
only when bash would have run that one command with those words: no expansion (`$`, a backquote,
a glob, a brace, `~`), no second command, redirection or assignment, no interpreter option (each
changes the interpreter itself: `-u`, `-O`, `-X`, `-c`...). Anything else runs cold, as today.

Stdlib only: the launcher runs isolated (`python -I -S`), and `tpupod job check` says the same.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

INTERPRETERS = ("python", "python3")
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_SHELL_CHARS = set("$`\\\n;&|<>(){}*?[]~#!")  # expansions, commands, redirections, globs


class NotStandby(ValueError):
    """The run line needs a shell or an interpreter option: `str()` says which part."""


@dataclass(frozen=True)
class RunLine:
    module: str | None  # `-m MODULE`
    script: str | None  # `SCRIPT.py`, relative to the job directory
    args: tuple[str, ...]

    @property
    def argv(self) -> list[str]:
        """`sys.argv` as the interpreter would set it (`-m`: the module's file replaces it)."""
        return ["-m" if self.module else str(self.script), *self.args]


def parse(run: str) -> RunLine:
    """The run line as a standby runs it, or NotStandby naming what bash would do otherwise."""
    outside_quotes = re.sub(r"'[^']*'", "", run)  # single quotes keep every character literal
    if bad := sorted(_SHELL_CHARS & set(outside_quotes)):
        shown = ", ".join(repr(c) for c in bad)
        raise NotStandby(f"the run line needs a shell for {shown}: a standby cannot stand in")
    lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        words = list(lexer)
    except ValueError as err:  # an unclosed quote
        raise NotStandby(f"the run line does not parse as one command: {err}") from None
    if words[:1] == ["exec"]:
        words = words[1:]
    if not words or words[0] not in INTERPRETERS:
        first = words[0] if words else "nothing"
        raise NotStandby(f"the run line starts with {first!r}, not python or python3")
    if len(words) < 2:
        raise NotStandby("the run line names no module or script")
    target, rest = words[1], tuple(words[2:])
    if target == "-m":
        if not rest or not MODULE.match(rest[0]):
            raise NotStandby("`-m` is not followed by a module name")
        return RunLine(rest[0], None, rest[1:])
    if target.startswith("-"):
        raise NotStandby(f"the interpreter option {target!r} changes the interpreter itself")
    if not target.endswith(".py"):
        raise NotStandby(f"{target!r} is not a .py script")
    return RunLine(None, target, rest)
