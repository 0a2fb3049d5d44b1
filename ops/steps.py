"""The recovery table's side of `ops.watch.Watcher`: observe what the incident's phase waits for
(a clock, an operation, the node, the workers' bootstrap), ask `ops.phases.advance`, and take the
one short step it names. Every wait has its own deadline (`WatchConfig`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ops.incident import Incident
from ops.job_status import JobRules
from ops.phases import (
    OBSERVES,
    Event,
    Phase,
    Step,
    advance,
    bootstrap_event,
    clock_event,
    operation_event,
    slice_event,
)
from ops.provider import ProviderError, SliceState
from ops.recovery import Limits, backoff
from ops.tpu import Stockout


@dataclass
class WatchConfig:
    limits: Limits = field(default_factory=Limits)
    rules: JobRules = field(default_factory=JobRules)  # the job's exit codes, steps, progress
    poll: float = 0.5
    max_failures: int = 3  # F: failure restarts before watch gives up (the job's max_restarts)
    ready_deadline: float = 1800.0  # create done -> READY
    operation_deadline: float = 1800.0  # a delete or create operation
    backoff_base: float = 2.0
    backoff_cap: float = 60.0
    capacity_retries: int = 20  # creates refused for capacity, per incident, before giving up
    capacity_backoff: float = 30.0  # first wait after a stockout, doubling up to the cap
    capacity_backoff_cap: float = 600.0
    ssh_retries: int = 3
    # SIGTERM -> SIGKILL for a crashed or hung job: its survivors are stuck in a collective and
    # ignore SIGTERM (a job's grace_s is for a preemption's save, which these cannot make).
    failure_stop_timeout: float = 3.0


class GiveUp(Exception):
    """A budget is spent; the message is the reason."""


class RecoverySteps:
    """Mixed into Watcher, which provides provider, journal, config, state, _api, _describe,
    _workers, _charge, _phase and _restart_job."""

    # -- the recovery table: observe what the phase waits for, take its step -----------------
    def _drive(self, inc: Incident) -> None:
        now = time.time()
        waited, deadline = now - inc.phase_since, self._deadline(inc.phase)
        observes, detail = OBSERVES[inc.phase], ""
        if observes == "clock":
            event = clock_event(now, inc.not_before)
        elif observes == "operation":
            if inc.operation is None:  # nothing to wait for (no node to delete) or lost
                event = Event.DONE if inc.phase is Phase.AWAITING_DELETE else None
                if event is None:  # a create issued before a restart, name not saved
                    return self._take(inc, Step.CREATE)
            else:
                status = self._api(lambda: self.provider.operation(inc.operation))
                if status is None:
                    return None
                event = operation_event(status.done, status.error_code, status.stockout,
                                        waited, deadline)  # fmt: skip
                detail = status.error_message
        else:
            info = self._describe()
            if info is None:
                return None
            detail = f"node {info.state}"
            if observes == "slice":
                event = slice_event(info.state, waited, deadline)
            elif observes == "clock+slice":
                ready = info.state is SliceState.READY
                event = clock_event(now, inc.not_before) if ready else Event.GONE
            else:
                boots = self._boot_states(info)
                event = bootstrap_event(info.state, boots, waited, deadline)
        if event is Event.DEADLINE:
            detail = f"{inc.phase} for {waited:.0f}s (deadline {deadline:.0f}s)"
        return self._on(inc, event, detail)

    def _on(self, inc: Incident, event: Event, detail: str = "") -> None:
        transition = advance(inc.phase, event)
        self._enter(inc, transition.phase)
        return self._take(inc, transition.step, detail)

    def _take(self, inc: Incident, step: Step, detail: str = "") -> None:
        now, cfg = time.time(), self.config
        if step is Step.DELETE:
            self.close()
            inc.started = now
            inc.operation = self._api(self.provider.start_delete)
            if inc.operation is None and self._provider_errors:
                self._enter(inc, Phase.PENDING_RECREATE)  # not issued: try again next poll
        elif step is Step.CREATE:
            self._enter(inc, Phase.AWAITING_CREATE)
            inc.operation = None
            try:  # refused at once: the same events as an operation that failed
                inc.operation = self.provider.start_create(attempt=self.state.attempt + 1)
            except Stockout as err:
                return self._on(inc, Event.STOCKOUT, str(err))
            except ProviderError as err:
                return self._on(inc, Event.FAILED, f"create failed: {err}")
            if inc.operation is None:  # the node exists already (created before a restart)
                return self._on(inc, Event.DONE)
        elif step is Step.STOCKOUT:
            inc.stockouts += 1
            if inc.stockouts > cfg.capacity_retries:
                raise GiveUp(f"no capacity after {inc.stockouts} creates: {detail}")
            wait = backoff(inc.stockouts, cfg.capacity_backoff, cfg.capacity_backoff_cap)
            inc.not_before = now + wait
            self.journal.event("stockout", f"{detail}; creating again in {wait:.0f}s",
                               attempt=inc.stockouts, retry_in=wait)  # fmt: skip
        elif step in (Step.RETRY, Step.REBUILD):
            if step is Step.REBUILD:
                self._charge(detail)
            inc.attempts += 1
            inc.not_before = now + backoff(inc.attempts, cfg.backoff_base, cfg.backoff_cap)
            self.journal.event("error", f"recreate attempt {inc.attempts} failed: {detail}")
        elif step is Step.RECREATED:
            self.state.attempt += 1  # the new node boots the job as this attempt
            self._phase("recreated", inc.started, f"slice {self.provider.name} recreated",
                        attempt=self.state.attempt, cause=inc.kind)  # fmt: skip
        elif step is Step.READY:
            self._phase("ready", inc.started, "slice READY")
            self.since = time.time()
            self.first_seen.clear()
        elif step is Step.BOOTSTRAPPED:
            self._phase("bootstrapped", inc.started, "bootstrap ok on every worker")
            inc.attempts = 0
        elif step is Step.RESTART:
            self._restart_job(failure=True)
        return None

    def _enter(self, inc: Incident, phase: Phase) -> None:
        if inc.phase is not phase:
            inc.phase, inc.phase_since = phase, time.time()

    def _deadline(self, phase: Phase) -> float:
        cfg = self.config
        return {
            Phase.AWAITING_DELETE: cfg.operation_deadline,
            Phase.AWAITING_CREATE: cfg.operation_deadline,
            Phase.AWAITING_READY: cfg.ready_deadline,
            Phase.AWAITING_BOOTSTRAP: cfg.limits.bootstrap,
        }.get(phase, float("inf"))

    def _boot_states(self, info) -> list[str | None]:
        if info.state is not SliceState.READY:
            return []
        probes = self._workers(info.workers).probe()
        return [p.bootstrap_state if p.reachable else None for p in probes]
