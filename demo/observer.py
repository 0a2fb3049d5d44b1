"""What `tpupod demo` watches and does while the watcher VM recovers: the planned faults (also
driven from an in-process Watcher's on_poll hook by tests and benchmarks), the watcher's journal
as the laptop reads it from the bucket, and the trainers' status over SSH."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from localpod import faults
from ops.cloud.slice import Provider, ProviderError, SliceState
from ops.cloud.storage_errors import STORAGE_ERRORS
from ops.fleet.probe import Probe
from ops.fleet.workers import WorkerGroup
from ops.watch import Watcher
from ops.watch.conditions import NOTICE_HEALTH
from ops.watch.journal import echo
from ops.watch.lease import Lease
from ops.watch.remote_state import RemoteState

HANG_S = 10.0  # heartbeat age that is a hang (the local default is 30 s)
OBSERVE_S = 1.0  # the observer's poll: journal objects; trainer status while a fault is due
PROGRESS_S = 5.0  # trainer status for the progress bar only


@dataclass
class Fault:
    """One planned fault of the local pod's vocabulary (localpod.faults.KINDS), at a step."""

    kind: str  # a localpod.faults kind: notice, kill, crash, hang, stockout, ...
    at_step: int
    worker: int = 0
    notice: float = 0.0

    def __post_init__(self) -> None:
        faults.kind_of(self.kind)

    @property
    def incident(self) -> str:
        """The incident kind the watcher reports for it."""
        return faults.KINDS[self.kind].incident

    @property
    def label(self) -> str:
        return faults.describe(self.kind, self.notice, self.worker)

    def inject(self, pod) -> object:
        return faults.inject(pod, self.kind, self.notice, self.worker)


@dataclass
class FaultPlan:
    """Injects faults in order (one per incident kind), each once the previous one has been
    recovered and every worker trains at its step: from the demo's observer loop (`observed`), or from an in-process
    Watcher's on_poll hook (tests, benchmarks)."""

    faults: list[Fault]
    pod: object
    injected: dict[str, float] = field(default_factory=dict)
    progress: Progress | None = None
    task: int | None = None

    def __call__(self, watcher: Watcher, probes: list[Probe]) -> None:
        steps = [s.step for p in probes if (s := p.current(watcher.state.since))]
        last = max(self.injected.values(), default=0.0)
        inc = watcher.state.incident
        settled = not self.injected or (
            inc is not None and inc.detected_at >= last and "resumed" in inc.phases
        )
        if steps and all(p.alive for p in probes) and (fault := self.due(steps, settled)):
            self.inject(fault, min(steps), watcher.journal.event)

    def observed(self, view: WatcherView, trainers: TrainerProbe) -> None:
        """The demo's loop: what the laptop sees (the watcher's journal, trainers over SSH); no
        SSH while the watcher recovers (the 2 cores are busier with that)."""
        settled = all(view.seen("resumed", kind, after=t) for kind, t in self.injected.items())
        pending = any(f.incident not in self.injected for f in self.faults)
        every = OBSERVE_S if pending else PROGRESS_S  # SSH costs CPU the trainers need
        if not settled or view.recovering() or time.time() - trainers.probed_at < every:
            return
        probes = trainers.probe()
        steps = [p.status.step for p in probes if fresh(p)]
        # Often only process 0 reports: every job alive, the reporting ones at the step.
        if steps and all(p.alive for p in probes) and (fault := self.due(steps, settled)):
            self.inject(fault, min(steps), view.note)

    def missed(self) -> list[Fault]:
        """Faults of the plan never injected (the run ended first): the demo fails on them."""
        return [f for f in self.faults if f.incident not in self.injected]

    def due(self, steps: list[int], settled: bool) -> Fault | None:
        if self.progress is not None and steps:
            self.progress.update(self.task, completed=max(steps))
        pending = self.missed()
        if pending and steps and settled and min(steps) >= pending[0].at_step:
            return pending[0]
        return None

    def inject(self, fault: Fault, step: int, journal: Callable[..., object]) -> None:
        try:
            fault.inject(self.pod)
        except Exception as err:  # noqa: BLE001 - the slice moved on; try again next poll
            journal("error", f"fault injection deferred: {err}")
            return
        self.injected[fault.incident] = time.time()
        journal("injected", f"{fault.label} at step ~{step}", kind=fault.incident, step=step,
                fault=fault.kind)  # fmt: skip


def fresh(probe: Probe) -> bool:
    """A live job training, its status written recently."""
    s = probe.status
    return bool(s and s.state == "training" and probe.alive is not False
                and probe.now - s.updated < HANG_S / 2)  # fmt: skip


class WatcherView:
    """The laptop's view of the watcher VM: its journal from the bucket as `tpupod logs
    --watcher` reads it, echoed and copied (with the demo's own events) to a local journal."""

    def __init__(self, state: RemoteState, path: Path, console: Console):
        self.state, self.path, self.console = state, path, console
        self.cursor = ""
        self.events: list[dict] = []
        path.unlink(missing_ok=True)

    def poll(self) -> None:
        try:
            records = self.state.read_journal(after=self.cursor)
        except STORAGE_ERRORS:
            return
        for name, record in records:
            self.cursor = name
            self._keep(record, "[watcher] ")

    def note(self, name: str, message: str = "", **fields) -> None:
        self._keep({"time": time.time(), "event": name, "message": message, "by": "demo",
                    **fields}, "[demo]    ")  # fmt: skip

    def _keep(self, record: dict, prefix: str) -> None:
        self.events.append(record)
        with self.path.open("a") as out:
            out.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        echo(self.console, record, prefix)

    def seen(self, name: str, kind: str | None = None, after: float = 0.0) -> bool:
        return any(e["event"] == name and kind in (None, e.get("kind")) and e["time"] >= after
                   and e.get("by") != "demo" for e in self.events)  # fmt: skip

    def recovering(self) -> bool:
        """The watcher's last incident is still open (detected, not yet resumed)."""
        marks = [e["event"] for e in self.events if e["event"] in ("detected", "resumed")]
        return bool(marks) and marks[-1] == "detected"

    def final(self) -> dict | None:
        return next((e for e in self.events if e["event"] in ("done", "gave_up")), None)

    def holder(self) -> str | None:
        try:
            view = Lease(self.state, "demo-observer", 0.0).read()
        except STORAGE_ERRORS:
            return None
        return view.holder if view else None


class TrainerProbe:
    """The jobs' status over SSH as the operator (what `tpupod status` shows); the node is
    only read through the TPU API, never changed."""

    def __init__(self, provider: Provider):
        self.provider, self.group = provider, None
        self.probed_at = 0.0

    def probe(self) -> list[Probe]:
        self.probed_at = time.time()
        if self.group is None:
            try:
                info = self.provider.describe()
            except ProviderError:
                return []
            if (
                info.state is not SliceState.READY
                or info.health in NOTICE_HEALTH
                or not info.workers
            ):
                return []
            self.group = WorkerGroup(info.workers, retries=0, connect_timeout=5.0)
        probes = self.group.probe()
        if not all(p.reachable for p in probes):
            self.close()  # a recreated slice has new workers: describe it again next time
            return []
        return probes

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
