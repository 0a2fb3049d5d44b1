"""`tpupod watch`: the recovery loop. Each poll observes what the current phase waits for, the
judge (ops.watch.judge) names one event, and `on` applies the recovery table's row for it
(ops.watch.transitions): the next phase, journaled as a `transition`, and one action
(ops.watch.actions). Nothing else changes a phase.

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

from ops.cloud.slice import Provider, ProviderError
from ops.cloud.tpu_errors import Refused, Stockout
from ops.fleet.probe import Probe
from ops.fleet.workers import WorkerGroup
from ops.watch import judge
from ops.watch.actions import ACTIONS, GiveUp
from ops.watch.conditions import (
    INCIDENT_KINDS,
    MAINTENANCE,
    NOTICE_HEALTH,
    SLICE_ACTIONS,
    SliceAction,
    WorkerCondition,
)
from ops.watch.deadlines import WatchConfig, backoff
from ops.watch.hold import Hold
from ops.watch.incident import Incident, IncidentStore, WatchState
from ops.watch.journal import Journal
from ops.watch.observe import OBSERVERS, quick_look
from ops.watch.progress import Progress
from ops.watch.step_clock import StepClock
from ops.watch.transitions import (
    OPENS,
    WAITS_FOR,
    Action,
    Event,
    Phase,
    Then,
    Transition,
    advance,
)

MAX_PROVIDER_ERRORS = 5
EXIT_DONE, EXIT_GAVE_UP = 0, 3  # 1 stays Python's own (an uncaught exception): restartable
# Events that change the slice or the job: never acted on while the run is held.
ACTING = {Event.SLICE_LOST, Event.UNUSABLE, Event.JOB_FAILED, Event.JOB_PREEMPTED,
          Event.NEW_BUNDLE}  # fmt: skip
CALM = {None, WorkerCondition.RUNNING, WorkerCondition.STARTING, WorkerCondition.BOOTSTRAPPING}
# The incident an action opens, where the judged condition does not name it.
OPENED_AS = {Action.NOTE_NOTICE: "preemption", Action.NOTE_STATE: "unknown-state",
             Action.STOP: "fatal", Action.ROLL_OUT: "rollout"}  # fmt: skip
DEFAULT_KIND = {Action.OPEN_RESTART: "crash", Action.RESTART_FREE: "crash"}


class Watcher:
    def __init__(
        self,
        provider: Provider,
        journal: Journal,
        config: WatchConfig | None = None,
        on_poll: Callable[[Watcher, list[Probe]], None] | None = None,
        store: IncidentStore | None = None,
        hold: Callable[[], dict | None] | None = None,
    ):
        self.provider, self.journal = provider, journal
        self.config = config or WatchConfig()
        self.rules = self.config.rules
        self.hold = Hold(hold, journal)  # the run's hold (ops.watch.remote_state), if any
        self.on_poll = on_poll  # the demo injects faults and draws progress from here
        self.store = store or IncidentStore(None)
        self.state = self.store.load() or WatchState(since=time.time())
        inc = self.state.incident
        zone = inc.zone if inc is not None and inc.open and inc.zone else self.state.zone
        if zone in provider.zones:
            provider.move_to(zone)  # where the slice was (a recreate under way goes on there)
        clock = StepClock(self.config.limits.step_clock, self.config.limits.step_floor)
        self.progress = Progress(self.state, journal, self.rules, clock=clock)
        self.first_seen: dict[str, float] = {}
        self.group: WorkerGroup | None = None
        self._endpoints: tuple = ()
        self.provider_errors = 0
        self.probes: list[Probe] = []
        self._saved: dict | None = None
        self.guard: Callable[[], None] | None = None  # each poll: renew the lease (ops.watch.lease)

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> int:
        self.journal.event("watching", f"stack {self.provider.name}", stack=self.provider.name)
        inc = self.state.incident
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
                now, poll = time.time(), self.config.poll
                pause = quick_look(self.state.incident, now, poll)  # an operation just issued
                time.sleep(self.progress.next_look(now, poll) if pause is None else pause)
        except GiveUp as err:
            self.journal.event("gave_up", str(err), failures=self.state.failures)
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
        """One observation: a waiting phase's, or the judged phases' (node + workers)."""
        inc = self.state.incident
        if self.recovering() and inc.phase in WAITS_FOR:
            self.drive(inc)
            if self.on_poll is not None:
                self.on_poll(self, [])
            return None
        info = self.describe()
        if info is None:
            return None
        self.probes = []
        # Under a notice or maintenance health the judge needs no SSH round trip (a notice is
        # detected at once; a node under maintenance is not probed).
        notice = info.health in NOTICE_HEALTH
        if SLICE_ACTIONS[info.state] is SliceAction.CHECK_WORKERS and not notice:
            self.probes = self.workers(info.workers).probe()
            self.progress.track(self.probes)
        decision = judge.decide(info, self.probes, self.state.since, self._waited,
                                self.config.limits, self.rules, self.state.last_step)  # fmt: skip
        self._tick(decision.key)
        if decision.key == MAINTENANCE and not info.spot:  # the VMs reboot: their files are stale
            self.state.since = time.time()
        if self.on_poll is not None:
            self.on_poll(self, self.probes)
        # Anything but a healthy slice is checked against a fresh hold: a `tpupod stop` stops the
        # job right after holding the run, and its exits are no incident.
        if self.hold.held(fresh=decision.event in ACTING or decision.condition not in CALM):
            return None
        recovering = self.recovering()
        resumed = recovering and bool(self.probes) and self.progress.resumed(self.probes)
        event = judge.refine(decision.event, recovering, resumed)
        kind = INCIDENT_KINDS.get(decision.condition) if decision.condition else None
        return self.on(event, decision.reason, kind)

    def drive(self, inc: Incident) -> None:
        """A waiting phase: observe the one thing it waits for, then apply its event."""
        waited = time.time() - inc.phase_since
        deadline = self.config.phase_deadline(inc.phase)
        seen = OBSERVERS[WAITS_FOR[inc.phase]](self, inc, waited, deadline)
        if seen is None:  # the TPU API did not answer: the same observation next poll
            return
        event, detail = seen
        if event is Event.DEADLINE and waited > deadline:  # else the observer's own limit
            detail = f"{inc.phase} for {waited:.0f}s (deadline {deadline:.0f}s)"
        self.on(event, detail)

    def on(self, event: Event, detail: str = "", kind: str | None = None) -> int | None:
        """The table's row for (phase, event): enter the next phase, journal the transition,
        take the action; again for the event the action hands back (`Then`), until none is
        left. The only place a phase changes. EXIT_DONE once the FINISH row was taken."""
        then: Then | None = Then(event, detail)
        while then is not None:
            transition = self._enter(then.event, then.detail, kind)
            if transition is None:
                return None
            inc = self.state.incident if self.recovering() else None
            then = ACTIONS[transition.action](self, inc, then.detail)
            if transition.action is Action.FINISH:
                return EXIT_DONE
            kind = None  # a follow-up belongs to the incident its first row opened
        return None

    def _enter(self, event: Event, detail: str, kind: str | None) -> Transition | None:
        """One row: the next phase (an incident opened where the action opens one), journaled."""
        inc = self.state.incident if self.recovering() else None
        phase = inc.phase if inc is not None else Phase.WATCHING
        transition = advance(phase, event)
        if transition is None:
            return None
        action = transition.action
        if action in OPENS:
            name = OPENED_AS.get(action) or kind or DEFAULT_KIND.get(action, "preemption")
            inc = self.detect(name, detail)
        if inc is not None and inc.phase is not transition.phase:
            inc.phase, inc.phase_since = transition.phase, time.time()
        self.journal.event("transition", f"{phase} --{event}--> {transition.phase}: {action}",
                           phase=phase, on=event, to=transition.phase, action=action)  # fmt: skip
        return transition

    # -- what the actions use ------------------------------------------------------------------
    def detect(self, kind: str, reason: str) -> Incident:
        if self.recovering():
            return self.state.incident  # the same incident, still being recovered
        now = time.time()
        self.state.incident = Incident(kind, reason, now, self.state.last_step, phase_since=now)
        self.journal.event("detected", f"{kind}: {reason}", kind=kind, step=self.state.last_step)
        return self.state.incident

    def recovering(self) -> bool:
        return self.state.incident is not None and self.state.incident.open

    def charge(self, reason: str) -> None:
        if self.state.failures >= self.config.max_failures:
            raise GiveUp(
                f"giving up after {self.state.failures} failure restarts "
                f"(budget {self.config.max_failures}); last: {reason}"
            )
        self.state.failures += 1
        self.state.streak += 1

    def restart_wait(self) -> float:
        """The first failure restart goes at once; a crash loop (failing again before the job
        commits a newer checkpoint) waits longer each time."""
        return backoff(self.state.streak - 1, self.config.backoff_base, self.config.backoff_cap)

    def restarted_now(self) -> None:
        """The job starts afresh: files older than now belong to the last attempt."""
        self.state.since = time.time()
        # A maintenance event is the node's, not the job's: a restart does not start it again.
        self.first_seen = {k: v for k, v in self.first_seen.items() if k == MAINTENANCE}

    def milestone(self, name: str, started: float, message: str, **fields) -> None:
        now = time.time()
        if self.state.incident is not None:
            self.state.incident.phases[name] = now
        self.journal.event(name, f"{message} in {now - started:.1f}s", seconds=now - started,
                           **fields)  # fmt: skip

    def close_incident(self) -> None:
        self.progress.close_incident(self.state.incident, self.probes)

    def api(self, call):
        """A TPU API call; a failure is journaled and retried next poll (None), up to a limit."""
        try:
            result = call()
        except Stockout:
            raise
        except Refused as err:  # sending it again cannot help: a person must fix it
            raise GiveUp(str(err)) from None
        except ProviderError as err:
            self.provider_errors += 1
            if self.provider_errors >= MAX_PROVIDER_ERRORS:
                raise
            self.journal.event("error", f"TPU API: {err}")
            time.sleep(backoff(self.provider_errors, self.config.backoff_base))
            return None
        self.provider_errors = 0
        return result

    def describe(self):
        return self.api(self.provider.describe)

    def workers(self, workers) -> WorkerGroup:
        """The SSH group for the current endpoints; rebuilt when they change."""
        key = tuple(workers) if workers is not None else self._endpoints
        if self.group is None or key != self._endpoints:
            self.close()
            self._endpoints = key
            self.group = WorkerGroup(key, retries=self.config.ssh_retries)
        return self.group

    # -- bookkeeping ---------------------------------------------------------------------------
    def _tick(self, key: str | None) -> None:
        now = time.time()
        self.first_seen = {key: self.first_seen.get(key, now)} if key else {}

    def _waited(self, key: str) -> float:
        return time.time() - self.first_seen.get(str(key), time.time())

    def _save(self) -> None:
        self.state.zone = self.provider.zone
        snapshot = asdict(self.state)
        if snapshot != self._saved:
            self.store.save(self.state)
            self._saved = snapshot
