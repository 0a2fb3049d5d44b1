"""What the recovery table's actions and observers may use of the watcher: the seam between
them and `ops.watch.watcher.Watcher`, which implements it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ops.cloud.slice import Provider, SliceInfo
from ops.fleet.probe import Probe
from ops.fleet.workers import WorkerGroup
from ops.watch.deadlines import WatchConfig
from ops.watch.incident import IncidentStore, WatchState
from ops.watch.journal import Journal


class GiveUp(Exception):
    """A budget is spent, or the job exited fatally; the message is the reason."""


class WatcherApi(Protocol):
    """What an action may use of the watcher (ops.watch.watcher.Watcher)."""

    provider: Provider
    journal: Journal
    config: WatchConfig
    state: WatchState
    store: IncidentStore  # or the bucket's RemoteState, which keeps hang forensics too
    probes: list[Probe]
    provider_errors: int

    def close(self) -> None: ...
    def api(self, call: Callable[[], Any]) -> Any: ...
    def charge(self, reason: str) -> None: ...
    def workers(self, workers) -> WorkerGroup: ...
    def milestone(self, name: str, started: float, message: str, **fields) -> None: ...
    def restarted_now(self) -> None: ...
    def restart_wait(self) -> float: ...
    def recovering(self) -> bool: ...
    def describe(self) -> SliceInfo | None: ...
    def close_incident(self) -> None: ...
