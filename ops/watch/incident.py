"""The incident being recovered and the budgets, persisted beside the journal (`incident.json`).

Written atomically at every phase change, so a `watch` that is stopped and started again (or a
second machine taking over) continues the incident: it polls the create operation already issued
instead of creating the node twice, and keeps counting against the same budgets.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ops.json_file import write_atomic
from ops.watch.transitions import Phase


@dataclass
class Incident:
    kind: str
    reason: str
    detected_at: float
    step: int  # the last step seen before the event
    phases: dict[str, float] = field(default_factory=dict)  # milestone -> wall time
    phase: Phase = Phase.WATCHING
    phase_since: float = 0.0  # when `phase` began: its deadline counts from here
    not_before: float = 0.0  # the end of a backoff (PENDING_* and AWAITING_CAPACITY)
    operation: str | None = None  # the pending delete/create operation's name
    started: float = 0.0  # when the current recreate or restart began
    attempts: int = 0  # recreate attempts in this incident (backoff)
    stockouts: int = 0  # creates refused for capacity in this incident
    quota_refusals: int = 0  # creates refused for quota in this incident
    request_failures: int = 0  # queued resources FAILED for a reason of their own
    zone: str | None = None  # where the slice is being recreated (one of tpupod:zones)
    zone_tries: dict[str, int] = field(default_factory=dict)  # refusals per zone: its backoff
    request_state: str | None = None  # the queued resource's state as last seen, and since when
    request_since: float = 0.0
    node_state: str | None = None  # the node's state as last seen while awaited READY, and since
    node_since: float = 0.0
    # Zones holding a queued resource of this incident still asking (oldest first; the newest is
    # the provider's zone): each keeps its place in its zone's queue until one is filled.
    queued_zones: list[str] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return "resumed" not in self.phases


@dataclass
class WatchState:
    """Everything `watch` must not forget across a restart."""

    failures: int = 0
    preemptions: int = 0
    streak: int = 0  # failure restarts since the job last committed a newer checkpoint
    committed: int | None = None  # the newest committed step any current trainer reported
    local_committed: int | None = None  # the newest step a local tier reported written whole
    since: float = 0.0  # the last (re)start of the trainer: older trainer files are stale
    last_step: int = 0
    attempt: int = 0  # the newest attempt of the job seen or started (the next one is + 1)
    zone: str | None = None  # where the slice was last (one of tpupod:zones)
    incident: Incident | None = None


def state_from_dict(raw: dict) -> WatchState | None:
    """incident.json's content (a file here, an object in the bucket: ops.watch.remote_state)."""
    try:
        raw = dict(raw)
        inc = raw.pop("incident", None)
        state = WatchState(**raw)
        if inc:
            inc["phase"] = Phase(inc.get("phase", Phase.WATCHING))
            state.incident = Incident(**inc)
        return state
    except (ValueError, TypeError):
        return None  # from another version: start afresh


class IncidentStore:
    def __init__(self, path: Path | str | None):
        self.path = Path(path) if path else None

    def load(self) -> WatchState | None:
        if self.path is None or not self.path.is_file():
            return None
        try:
            return state_from_dict(json.loads(self.path.read_text()))
        except ValueError:
            return None

    def save(self, state: WatchState) -> None:
        if self.path is not None:
            write_atomic(self.path, asdict(state))

    def clear(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
