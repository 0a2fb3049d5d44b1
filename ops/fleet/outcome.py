"""One worker's result of one command over SSH: what ops.fleet.workers returns and ops.fleet.probe parses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Outcome:
    """One worker's result: `exited` is None when SSH itself failed (then `error` says why)."""

    index: int
    exited: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    fatal: bool = False  # a refused host key: retrying cannot help

    @property
    def ok(self) -> bool:
        return self.exited == 0
