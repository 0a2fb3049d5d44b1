"""How each worker's job started, in `jobctl start`'s own words: from its parked standby (its
imports done), or cold because the standby was refused (why, in names only). The watcher
journals it with the restart and `tpupod restart` prints it, so a standby that never helps (an
environment that differs on every restart, say) shows as such rather than as restarts that are
merely slow. A cold start with no standby to refuse says nothing: most jobs have none."""

from __future__ import annotations

from dataclasses import dataclass, field

from ops.fleet.outcome import Outcome

# jobctl's words (bootstrap/jobctl.sh cmd_start, bootstrap/jobctl_standby.sh promote_standby):
# tests/ops/test_starts.py checks that the scripts still say them.
PROMOTED = "): the standby"  # stdout: "job started (pid P, attempt A): the standby"
REFUSED = "standby refused: "  # stderr: "standby refused: the environment differs in LANG"


@dataclass(frozen=True)
class Starts:
    workers: int
    promoted: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)

    @property
    def any(self) -> bool:
        """Whether any worker had a standby to use (promoted or refused)."""
        return bool(self.promoted or self.refused)

    def text(self) -> str:
        """'' when no worker had a standby to use; else a clause for the restart's line."""
        if not self.any:
            return ""
        said = f", {len(self.promoted)} of {self.workers} from their standby"
        cold = "; ".join(f"worker {i} cold ({why})" for i, why in sorted(self.refused.items()))
        return f"{said}; {cold}" if cold else said

    def fields(self) -> dict:
        """The journal's fields: {} when no worker had a standby to use."""
        if not self.any:
            return {}
        refused = {str(i): why for i, why in sorted(self.refused.items())}
        return {"standby": {"promoted": sorted(self.promoted), "refused": refused}}


def starts(outcomes: dict[int, Outcome]) -> Starts:
    """From every worker's `jobctl start` outcome."""
    promoted, refused = [], {}
    for index, outcome in sorted(outcomes.items()):
        if PROMOTED in outcome.stdout:
            promoted.append(index)
        for line in outcome.stderr.splitlines():
            if line.startswith(REFUSED):
                refused[index] = line.strip()
    return Starts(len(outcomes), promoted, refused)
