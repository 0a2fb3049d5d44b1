"""`tpupod watch`: the recovery loop. Observe -> `ops.recovery.decide` -> one handler per action.

Every event goes to the journal (JSON lines, for the goodput report) and one line to the terminal.
Preemptions are free; failure restarts (crash, hang, broken bootstrap) are bounded by a budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ops.journal import Journal
from ops.provider import Provider, ProviderError, SliceState
from ops.recovery import (
    GONE_AGAIN,
    INCIDENT_KINDS,
    NOTICE_HEALTH,
    SLICE_ACTIONS,
    Action,
    Decision,
    Limits,
    Probe,
    SliceAction,
    WorkerCondition,
    backoff,
    decide,
)
from ops.workers import WorkerError, WorkerGroup
from trainer.status import TrainerState

RESUMED_STATES = {TrainerState.TRAINING, TrainerState.SAVING, TrainerState.DONE}
MAX_PROVIDER_ERRORS = 5


@dataclass
class WatchConfig:
    limits: Limits = field(default_factory=Limits)
    poll: float = 0.5
    max_failures: int = 3  # F: failure restarts before watch gives up
    ready_deadline: float = 1800.0  # recreate -> READY
    backoff_base: float = 2.0
    backoff_cap: float = 60.0
    ssh_retries: int = 3
    failure_stop_timeout: float = 5.0  # SIGTERM -> SIGKILL for crashed or hung trainers


@dataclass
class Incident:
    kind: str
    reason: str
    detected_at: float
    step: int  # the last step seen before the event
    phases: dict[str, float] = field(default_factory=dict)


class GiveUp(Exception):
    """The failure budget is spent; the message is the reason."""


class Watcher:
    def __init__(
        self,
        provider: Provider,
        journal: Journal,
        config: WatchConfig | None = None,
        on_poll: Callable[[Watcher, list[Probe]], None] | None = None,
    ):
        self.provider, self.journal = provider, journal
        self.config = config or WatchConfig()
        self.on_poll = on_poll  # the demo injects faults and draws progress from here
        self.failures = self.preemptions = self.recreate_attempts = 0
        self.since = time.time()  # the last (re)start: older trainer files are stale
        self.first_seen: dict[str, float] = {}
        self.incident: Incident | None = None
        self.last_step = 0
        self.group: WorkerGroup | None = None
        self._endpoints: tuple = ()
        self._provider_errors = 0
        self._progress: dict[int, tuple] = {}

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> int:
        self.journal.event("watching", f"stack {self.provider.name}", stack=self.provider.name)
        try:
            while True:
                code = self.step()
                if code is not None:
                    return code
                time.sleep(self.config.poll)
        except GiveUp as err:
            self.journal.event("gave_up", str(err), failures=self.failures)
            return 1
        except KeyboardInterrupt:
            self.journal.event("interrupted", "stopped by the user; the slice keeps running")
            raise
        finally:
            self.close()

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def step(self) -> int | None:
        """One observation and the action the table picks for it."""
        info = self._describe()
        if info is None:
            return None
        probes: list[Probe] = []
        # During a preemption notice the table needs no SSH round trip: detect at once.
        notice = info.health in NOTICE_HEALTH
        if SLICE_ACTIONS[info.state] is SliceAction.CHECK_WORKERS and not notice:
            probes = self._workers(info.workers).probe()
            self._track(probes)
        limits = self.config.limits
        decision = decide(info.state, probes, self.since, self._waited, limits, info.health)
        self._tick(decision.key)
        if self.on_poll is not None:
            self.on_poll(self, probes)
        return HANDLERS[decision.action](self, decision, probes)

    # -- handlers, one per action --------------------------------------------------------------
    def _wait(self, decision: Decision, probes: list[Probe]) -> None:
        if decision.condition is WorkerCondition.PREEMPTED:
            self._detect("preemption", decision.reason)  # notice seen before the node went away
        elif self._recovering() and probes and self._resumed(probes):
            self._finish_incident(probes)

    def _recreate(self, decision: Decision, probes: list[Probe], failure: bool = False) -> None:
        kind = INCIDENT_KINDS.get(decision.condition, "preemption")
        # 1. record the event (once per incident) and charge the right budget
        self._detect(kind, decision.reason)
        if failure:
            self._charge(decision.reason)
        else:
            self.preemptions += 1
        # 2. back off between failed attempts, then delete + create the slice again
        self.recreate_attempts += 1
        cfg = self.config
        time.sleep(backoff(self.recreate_attempts - 1, cfg.backoff_base, cfg.backoff_cap))
        self.close()
        started = time.time()
        try:
            self.provider.recreate()
        except ProviderError as err:
            self.journal.event("error", f"recreate failed: {err}")
            return
        self._phase("recreated", started, f"slice {self.provider.name} recreated")
        # 3. wait for READY within the deadline
        info = self._await(lambda i: i.state is SliceState.READY, self.config.ready_deadline)
        if info is None:
            self.journal.event("error", "slice not READY before the deadline; recreating again")
            return
        self._phase("ready", started, f"slice READY ({len(info.workers)} workers)")
        self.since = time.time()
        self.first_seen.clear()
        # 4. verify the bootstrap on every worker (it starts the trainer at its end)
        probes = self._await_bootstrap(info.workers)
        if probes is not None:
            self._phase("bootstrapped", started, "bootstrap ok on every worker")
            self.recreate_attempts = 0

    def _rebuild(self, decision: Decision, probes: list[Probe]) -> None:
        self._recreate(decision, probes, failure=True)

    def _restart(self, decision: Decision, probes: list[Probe], failure: bool = True) -> None:
        kind = INCIDENT_KINDS.get(decision.condition, "crash")
        # 1. record, 2. charge the failure budget (gives up past F), 3. back off
        self._detect(kind, decision.reason)
        if failure:
            self._charge(decision.reason)
            time.sleep(backoff(self.failures, self.config.backoff_base, self.config.backoff_cap))
        # 4. stop-all, clear-locks-all, start-all: every worker together
        group = self._workers(None)
        started = time.time()
        try:
            stop = self.config.failure_stop_timeout if failure else None
            group.trainerctl("stop", timeout=180.0, stop_timeout=stop)
            group.trainerctl("clear-locks")
            self.since = time.time()
            self.first_seen.clear()
            group.trainerctl("start")
        except WorkerError as err:
            self.journal.event("error", f"restart failed: {err}")
            return
        self._phase("restarted", started, "trainer restarted on every worker")

    def _resume(self, decision: Decision, probes: list[Probe]) -> None:
        self._restart(decision, probes, failure=False)

    def _finish(self, decision: Decision, probes: list[Probe]) -> int:
        if self._recovering():
            self._finish_incident(probes)
        step = max((p.status.step for p in probes if p.status), default=self.last_step)
        counts = dict(preemptions=self.preemptions, failures=self.failures)
        message = f"every worker done at step {step} ({self.preemptions} preemptions, "
        self.journal.event(
            "done", message + f"{self.failures} failure restarts)", step=step, **counts
        )
        return 0

    # -- bookkeeping ---------------------------------------------------------------------------
    def _detect(self, kind: str, reason: str) -> None:
        if self._recovering():
            return  # the same incident, still being recovered
        self.incident = Incident(kind, reason, time.time(), self.last_step)
        self.journal.event("detected", f"{kind}: {reason}", kind=kind, step=self.last_step)

    def _recovering(self) -> bool:
        return self.incident is not None and "resumed" not in self.incident.phases

    def _charge(self, reason: str) -> None:
        if self.failures >= self.config.max_failures:
            raise GiveUp(
                f"giving up after {self.failures} failure restarts "
                f"(budget {self.config.max_failures}); last: {reason}"
            )
        self.failures += 1

    def _phase(self, name: str, started: float, message: str) -> None:
        now = time.time()
        if self.incident is not None:
            self.incident.phases[name] = now
        self.journal.event(name, f"{message} in {now - started:.1f}s", seconds=now - started)

    def _resumed(self, probes: list[Probe]) -> bool:
        fresh = [p.status for p in probes if p.status and p.status.heartbeat >= self.since]
        return len(fresh) == len(probes) and all(s.state in RESUMED_STATES for s in fresh)

    def _finish_incident(self, probes: list[Probe]) -> None:
        inc = self.incident
        restored = min((p.status.restored_from or 0) for p in probes if p.status)
        inc.phases["resumed"] = now = time.time()
        lost = max(0, inc.step - restored)
        self.last_step = restored
        self.journal.event(
            "resumed",
            f"resumed at step {restored} after {inc.kind}: {lost} steps lost, "
            f"{now - inc.detected_at:.1f}s since detection",
            kind=inc.kind,
            step=restored,
            steps_lost=lost,
            detected_at=inc.detected_at,
            recovery_s=now - inc.detected_at,
            phases={k: v - inc.detected_at for k, v in inc.phases.items()},
        )

    def _track(self, probes: list[Probe]) -> None:
        now = time.time()
        for p in probes:  # progress: when did this worker's (state, step) last change?
            mark = (p.status.state, p.status.step, p.status.pid) if p.status else None
            last = self._progress.get(p.index)
            if last is None or last[0] != mark:
                self._progress[p.index] = last = (mark, now)
            p.progress_age = now - last[1]
        for p in probes:
            if p.status is not None and p.status.heartbeat >= self.since:
                self.last_step = max(self.last_step, p.status.step)
        if self.incident is not None and not self.incident.phases:
            self.incident.step = max(self.incident.step, self.last_step)  # steps until it died

    def _tick(self, key: str | None) -> None:
        now = time.time()
        self.first_seen = {key: self.first_seen.get(key, now)} if key else {}

    def _waited(self, key: str) -> float:
        return time.time() - self.first_seen.get(str(key), time.time())

    def _describe(self):
        try:
            info = self.provider.describe()
        except ProviderError as err:
            self._provider_errors += 1
            if self._provider_errors >= MAX_PROVIDER_ERRORS:
                raise
            self.journal.event("error", f"describe failed: {err}")
            time.sleep(backoff(self._provider_errors, self.config.backoff_base))
            return None
        self._provider_errors = 0
        return info

    def _workers(self, workers) -> WorkerGroup:
        """The SSH group for the current endpoints; rebuilt when they change."""
        key = tuple(workers) if workers is not None else self._endpoints
        if self.group is None or key != self._endpoints:
            self.close()
            self._endpoints = key
            self.group = WorkerGroup(key, retries=self.config.ssh_retries)
        return self.group

    def _await(self, done, deadline: float):
        """Polls describe() until `done`; None past the deadline or when the slice died again."""
        end = time.time() + deadline
        while time.time() < end:
            info = self._describe()
            if info is not None and done(info):
                return info
            if info is not None and info.state in GONE_AGAIN:
                return None
            time.sleep(self.config.poll)
        return None

    def _await_bootstrap(self, workers) -> list[Probe] | None:
        end = time.time() + self.config.limits.bootstrap
        group = self._workers(workers)
        while time.time() < end:
            info = self._describe()
            if info is not None and info.state is not SliceState.READY:
                return None  # preempted again while booting: the main loop recreates
            probes = group.probe()
            states = {p.bootstrap_state for p in probes if p.reachable}
            if len(states) == 1 and states == {"ok"} and all(p.reachable for p in probes):
                return probes
            if "failed" in states:
                return None  # the main loop sees BOOTSTRAP_FAILED and rebuilds
            time.sleep(self.config.poll)
        return None


HANDLERS: dict[Action, Callable[..., int | None]] = {
    Action.WAIT: Watcher._wait,
    Action.RECREATE: Watcher._recreate,
    Action.REBUILD: Watcher._rebuild,
    Action.RESTART: Watcher._restart,
    Action.RESUME: Watcher._resume,
    Action.FINISH: Watcher._finish,
}
