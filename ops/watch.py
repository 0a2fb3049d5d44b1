"""`tpupod watch`: the recovery loop. Each poll does one of two things, both table-driven:
- no recovery step pending: observe (node + one probe per worker) -> `ops.recovery.decide`
  -> one handler per action (which opens or advances an incident);
- a recovery step pending: observe what that phase waits for -> `ops.phases.advance` -> one
  short step (issue a delete or create, journal a milestone, restart the trainer).

Every event goes to the journal (JSON lines, for the goodput report) and one line to the
terminal; the incident and the budgets go to `incident.json` beside it at every change.
Preemptions are free; failure restarts (crash, hang, broken bootstrap) are bounded by a budget
(the job's `max_restarts`); stockouts on create have a budget of their own; a fatal exit code
(the job's `exit_codes.fatal`) stops recovery at once. While the run is held (`tpupod stop`) no
action is taken.

Exit codes: 0 every worker done, 3 gave up (a budget spent, or the job exited fatally), 1 an
internal error (an exception: the watcher's service restarts it), 2 bad input (tpupod's CLI).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

from ops.forensics import capture_hang
from ops.incident import Incident, IncidentStore, WatchState
from ops.job_status import RESUMED_STATES, JobRules
from ops.journal import Journal
from ops.phases import OBSERVES, Phase
from ops.probe import Probe
from ops.provider import ProviderError
from ops.recovery import (
    INCIDENT_KINDS,
    NOTICE_HEALTH,
    SLICE_ACTIONS,
    Action,
    Decision,
    SliceAction,
    WorkerCondition,
    backoff,
    decide,
)
from ops.steps import GiveUp, RecoverySteps, WatchConfig
from ops.tpu import Stockout, TpuProvider
from ops.workers import WorkerError, WorkerGroup

FALLBACK_PREFIX = "checkpoint_fallback:"  # trainer/train.py's status message after a fallback
MAX_PROVIDER_ERRORS = 5
EXIT_DONE, EXIT_GAVE_UP = 0, 3  # 1 stays Python's own (an uncaught exception): restartable
HOLD_CHECK_S = 2.0  # a hold (tpupod stop) is read at most this often, and before every action
# Actions that change the slice or the job: never taken while the run is held.
ACTING = {Action.RECREATE, Action.REBUILD, Action.RESTART, Action.RESUME}
CALM = {None, WorkerCondition.RUNNING, WorkerCondition.STARTING, WorkerCondition.BOOTSTRAPPING}


class Watcher(RecoverySteps):
    def __init__(
        self,
        provider: TpuProvider,
        journal: Journal,
        config: WatchConfig | None = None,
        on_poll: Callable[[Watcher, list[Probe]], None] | None = None,
        store: IncidentStore | None = None,
        hold: Callable[[], dict | None] | None = None,
    ):
        self.provider, self.journal = provider, journal
        self.config = config or WatchConfig()
        self.rules: JobRules = self.config.rules
        self.read_hold = hold or (lambda: None)  # the run's hold (ops.remote_state), if any
        self._hold: tuple[float, dict | None] = (0.0, None)
        self._said_held = False
        self.on_poll = on_poll  # the demo injects faults and draws progress from here
        self.store = store or IncidentStore(None)
        self.state = self.store.load() or WatchState(since=time.time())
        self.first_seen: dict[str, float] = {}
        self.group: WorkerGroup | None = None
        self._endpoints: tuple = ()
        self._provider_errors = 0
        self._progress: dict[int, tuple] = {}
        self._fallbacks_seen: set[tuple[int, int | None]] = set()
        self._saved: dict | None = None
        self.guard: Callable[[], None] | None = None  # each poll: e.g. renew the lease (ops.lease)

    # The persisted state, under the names the demo and the benchmarks read.
    since = property(lambda s: s.state.since, lambda s, v: setattr(s.state, "since", v))
    incident = property(lambda s: s.state.incident)
    failures = property(lambda s: s.state.failures)
    preemptions = property(lambda s: s.state.preemptions)
    last_step = property(lambda s: s.state.last_step)

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> int:
        self.journal.event("watching", f"stack {self.provider.name}", stack=self.provider.name)
        inc = self.incident
        if inc is not None and inc.open:
            self.journal.event(
                "continuing", f"{inc.kind} incident, {inc.phase}", kind=inc.kind, phase=inc.phase
            )
        try:
            while True:
                if self.guard is not None:
                    self.guard()  # raises when this watcher may no longer act
                code = self.step()
                self._save()
                if code is not None:
                    self.store.clear()
                    return code
                time.sleep(self.config.poll)
        except GiveUp as err:
            self.journal.event("gave_up", str(err), failures=self.failures)
            self.store.clear()
            return EXIT_GAVE_UP
        except KeyboardInterrupt:
            self._save()
            self.journal.event("interrupted", "stopped by the user; the slice keeps running")
            raise
        finally:
            self.close()

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def step(self) -> int | None:
        """One observation and the one step the tables pick for it."""
        inc = self.incident
        if inc is not None and inc.open and inc.phase in OBSERVES:
            self._drive(inc)
            if self.on_poll is not None:
                self.on_poll(self, [])
            return None
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
        decision = decide(info.state, probes, self.since, self._waited, limits, info.health,
                          self.rules, self.last_step)  # fmt: skip
        self._tick(decision.key)
        if self.on_poll is not None:
            self.on_poll(self, probes)
        # Anything but a healthy slice is checked against a fresh hold: a `tpupod stop` stops the
        # job right after holding the run, and its exits are no incident.
        if self.held(fresh=decision.action in ACTING or decision.condition not in CALM):
            return None
        return HANDLERS[decision.action](self, decision, probes)

    def held(self, fresh: bool = False) -> bool:
        """The run is stopped on purpose (`tpupod stop`): watch but never act, until `start`."""
        now = time.time()
        if fresh or now - self._hold[0] > HOLD_CHECK_S:
            self._hold = (now, self.read_hold())
        hold = self._hold[1]
        if hold and not self._said_held:
            by = hold.get("by", "someone")
            self.journal.event("held", f"run stopped by {by} (`tpupod start` resumes it); "
                               "watching without acting", by=by)  # fmt: skip
        elif not hold and self._said_held:
            self.journal.event("unheld", "run started again: recovery resumes")
        self._said_held = bool(hold)
        return bool(hold)

    # -- observation handlers, one per action --------------------------------------------------
    def _wait(self, decision: Decision, probes: list[Probe]) -> None:
        if decision.condition is WorkerCondition.PREEMPTED:
            self._detect("preemption", decision.reason)  # notice seen before the node went away
        elif self._recovering() and probes and self._resumed(probes):
            self._finish_incident(probes)

    def _recreate(self, decision: Decision, probes: list[Probe], failure: bool = False) -> None:
        kind = INCIDENT_KINDS.get(decision.condition, "preemption")
        inc = self._detect(kind, decision.reason)
        if failure:
            self._charge(decision.reason)
        else:
            self.state.preemptions += 1
        self._enter(inc, Phase.PENDING_RECREATE)
        cfg = self.config
        inc.not_before = time.time() + backoff(inc.attempts, cfg.backoff_base, cfg.backoff_cap)
        self._drive(inc)  # issues the delete at once unless backing off

    def _rebuild(self, decision: Decision, probes: list[Probe]) -> None:
        self._recreate(decision, probes, failure=True)

    def _restart(self, decision: Decision, probes: list[Probe], failure: bool = True) -> None:
        kind = INCIDENT_KINDS.get(decision.condition, "crash")
        inc = self._detect(kind, decision.reason)
        capture_hang(self, inc)  # a hang's stacks, before the restart destroys them
        if not failure:
            self._restart_job(failure=False)
            return
        self._charge(decision.reason)
        self._enter(inc, Phase.PENDING_RESTART)
        inc.not_before = time.time() + self.restart_wait()
        self._drive(inc)

    def restart_wait(self) -> float:
        """The first failure restart goes at once; a crash loop (failing again before the job
        commits a newer checkpoint) waits longer each time."""
        return backoff(self.state.streak - 1, self.config.backoff_base, self.config.backoff_cap)

    def _resume(self, decision: Decision, probes: list[Probe]) -> None:
        self._restart(decision, probes, failure=False)

    def _stop(self, decision: Decision, probes: list[Probe]) -> int:
        """A fatal exit: restarting cannot help, and spot hours are not spent on trying."""
        self._detect("fatal", decision.reason)
        raise GiveUp(f"the job exited fatally, not restarted: {decision.reason}")

    def _restart_job(self, failure: bool) -> None:
        """stop-all, clear-locks-all, start-all: every worker together, as the next attempt.
        After a crash or a hang the survivors are stuck in a collective and ignore SIGTERM:
        they get a short grace of their own, not the job's (a preemption's save time)."""
        inc = self.incident
        group = self._workers(None)
        inc.started = started = time.time()
        self._enter(inc, Phase.AWAITING_RESUME)
        attempt = self.state.attempt + 1
        try:
            stop = self.config.failure_stop_timeout if failure else None
            group.jobctl("stop", timeout=None, stop_timeout=stop)
            group.jobctl("clear-locks")
            self.since = time.time()
            self.first_seen.clear()
            group.jobctl("start", attempt=attempt)
        except WorkerError as err:
            self.journal.event("error", f"restart failed: {err}")
            return
        self.state.attempt = attempt
        self._phase("restarted", started, f"job restarted on every worker (attempt {attempt})",
                    attempt=attempt, cause=inc.kind)  # fmt: skip

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
    def _detect(self, kind: str, reason: str) -> Incident:
        if self._recovering():
            return self.incident  # the same incident, still being recovered
        now = time.time()
        self.state.incident = Incident(kind, reason, now, self.last_step, phase_since=now)
        self.journal.event("detected", f"{kind}: {reason}", kind=kind, step=self.last_step)
        return self.state.incident

    def _recovering(self) -> bool:
        return self.incident is not None and self.incident.open

    def _charge(self, reason: str) -> None:
        if self.failures >= self.config.max_failures:
            raise GiveUp(
                f"giving up after {self.failures} failure restarts "
                f"(budget {self.config.max_failures}); last: {reason}"
            )
        self.state.failures += 1
        self.state.streak += 1

    def _phase(self, name: str, started: float, message: str, **fields) -> None:
        now = time.time()
        if self.incident is not None:
            self.incident.phases[name] = now
        self.journal.event(name, f"{message} in {now - started:.1f}s", seconds=now - started,
                           **fields)  # fmt: skip

    def _resumed(self, probes: list[Probe]) -> bool:
        """Every worker's job runs (or ran to its end) and, for a job that reports progress,
        the slice reports a step again."""
        if not all(p.alive or p.current(self.since) for p in probes):
            return False
        fresh = [p.current(self.since) for p in probes if p.current(self.since)]
        if not self.rules.reports_progress:
            return True
        return bool(fresh) and all(s.state in RESUMED_STATES for s in fresh)

    def _finish_incident(self, probes: list[Probe]) -> None:
        """The step it resumed from: what the job reports it restored (the built-in trainer and
        tpupod_job do), else the first step seen after the restart, less one (a job that prints
        its steps: an upper bound)."""
        inc = self.incident
        fresh = [s for p in probes if (s := p.current(self.since))]
        reported = [s.restored_from for s in fresh if s.restored_from is not None]
        restored = (
            min(reported) if reported else max(0, min((s.step for s in fresh), default=1) - 1)
        )
        inc.phases["resumed"] = now = time.time()
        self._enter(inc, Phase.WATCHING)
        lost = max(0, inc.step - restored)
        self.state.last_step = restored
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
        """Progress is the slice's: the age of the newest change of any worker's (state, step)
        (often only process 0 reports, and one stalled worker stalls them all)."""
        now = time.time()
        ages = []
        for p in probes:  # progress: when did this worker's (state, step) last change?
            s = p.current(self.since)
            mark = (s.state, s.step, s.pid) if s else None
            last = self._progress.get(p.index)
            if last is None or last[0] != mark:
                self._progress[p.index] = last = (mark, now)
            if s is not None:
                ages.append(now - last[1])
        for p in probes:
            p.progress_age = min(ages, default=0.0)
            if p.attempt is not None:
                self.state.attempt = max(self.state.attempt, p.attempt)
            if (s := p.current(self.since)) is not None:
                self.state.last_step = max(self.last_step, s.step)
                self._committed(s.last_checkpoint)
        self._journal_fallbacks(probes)
        if self.incident is not None and not self.incident.phases:
            self.incident.step = max(self.incident.step, self.last_step)  # steps until it died

    def _committed(self, step: int | None) -> None:
        """A committed step newer than any seen before is progress: it ends a streak of failure
        restarts (`committed` only grows, so it is newer than the last failure's too)."""
        st = self.state
        if step is not None and (st.committed is None or step > st.committed):
            st.committed, st.streak = step, 0

    def _journal_fallbacks(self, probes: list[Probe]) -> None:
        """A trainer that restored past an unreadable checkpoint says so in its status message
        (trainer/restore.py); journal it once per trainer process."""
        for p in probes:
            s = p.status
            if s is None or not (s.message or "").startswith(FALLBACK_PREFIX):
                continue
            if (p.index, s.pid) in self._fallbacks_seen:
                continue
            self._fallbacks_seen.add((p.index, s.pid))
            detail = s.message[len(FALLBACK_PREFIX) :].strip()
            self.journal.event("checkpoint_fallback", f"worker {p.index}: {detail}",
                               worker=p.index, restored=s.restored_from)  # fmt: skip

    def _tick(self, key: str | None) -> None:
        now = time.time()
        self.first_seen = {key: self.first_seen.get(key, now)} if key else {}

    def _waited(self, key: str) -> float:
        return time.time() - self.first_seen.get(str(key), time.time())

    def _save(self) -> None:
        snapshot = asdict(self.state)
        if snapshot != self._saved:
            self.store.save(self.state)
            self._saved = snapshot

    def _api(self, call):
        """A TPU API call; a failure is journaled and retried next poll (None), up to a limit."""
        try:
            result = call()
        except Stockout:
            raise
        except ProviderError as err:
            self._provider_errors += 1
            if self._provider_errors >= MAX_PROVIDER_ERRORS:
                raise
            self.journal.event("error", f"TPU API: {err}")
            time.sleep(backoff(self._provider_errors, self.config.backoff_base))
            return None
        self._provider_errors = 0
        return result

    def _describe(self):
        return self._api(self.provider.describe)

    def _workers(self, workers) -> WorkerGroup:
        """The SSH group for the current endpoints; rebuilt when they change."""
        key = tuple(workers) if workers is not None else self._endpoints
        if self.group is None or key != self._endpoints:
            self.close()
            self._endpoints = key
            self.group = WorkerGroup(key, retries=self.config.ssh_retries)
        return self.group


HANDLERS: dict[Action, Callable[..., int | None]] = {
    Action.WAIT: Watcher._wait,
    Action.RECREATE: Watcher._recreate,
    Action.REBUILD: Watcher._rebuild,
    Action.RESTART: Watcher._restart,
    Action.RESUME: Watcher._resume,
    Action.FINISH: Watcher._finish,
    Action.STOP: Watcher._stop,
}
