"""One plain function per `Action` of the recovery table: the short step a transition takes.

Each gets the watcher (its provider, journal, budgets and persisted state), the incident and the
why, and returns None or, when its outcome is known at once (a create refused, a delete not
issued, a backoff already over), that outcome as the next event (`Then`): `Watcher.on` applies
its row in turn, so it too is a row of the table and no action re-enters the table itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from contract.metadata import BUNDLE_SHA256
from ops.cloud.slice import ProviderError
from ops.cloud.tpu_errors import QuotaExceeded, Refused, Stockout
from ops.fleet.forensics import capture_hang
from ops.fleet.starts import starts
from ops.fleet.workers import STOP_AND_CLEAR, WorkerError
from ops.watch import capacity
from ops.watch.api import GiveUp, WatcherApi
from ops.watch.incident import Incident
from ops.watch.judge import clock_event
from ops.watch.remote_state import RemoteState
from ops.watch.transitions import Action, Event, Then


def delete(w: WatcherApi, inc: Incident, detail: str) -> Then | None:
    refreshed = w.api(w.provider.refresh_spec)  # the node as `pulumi up` left it, while it exists
    if refreshed:
        w.journal.event("spec_refreshed", f"the recreate follows the node: {', '.join(refreshed)}",
                        keys=refreshed)  # fmt: skip
    w.close()
    inc.started = time.time()
    inc.operation = w.api(w.provider.start_delete)  # the request here goes with its node
    if w.provider.zone in inc.queued_zones and not w.provider_errors:
        inc.queued_zones.remove(w.provider.zone)
    if inc.operation is None and w.provider_errors:
        return Then(Event.NOT_ISSUED, detail)  # not issued: try again next poll
    return None


def create(w: WatcherApi, inc: Incident, detail: str) -> Then | None:
    inc.operation = None
    inc.zone = w.provider.zone
    inc.node_state, inc.node_since = None, 0.0  # the next node's states are its own
    if w.provider.queued:
        capacity.sweep(w, inc)
    beside = any(z != w.provider.zone for z in inc.queued_zones)  # a request waits elsewhere
    try:  # refused at once: the same events as an operation that failed
        inc.operation = w.provider.start_create(attempt=w.state.attempt + 1)
    except (Stockout, QuotaExceeded) as err:
        if beside:  # that one keeps its place; no budget is spent
            return Then(Event.REFUSED_BESIDE, str(err))
        if isinstance(err, Stockout):
            return Then(Event.STOCKOUT, str(err))
        return Then(Event.REGION_QUOTA if err.regional else Event.QUOTA, str(err))
    except Refused as err:  # permission or an invalid spec: no retry can pass it
        raise GiveUp(str(err)) from None
    except ProviderError as err:
        return Then(Event.FAILED, f"create failed: {err}")
    if inc.operation is None:  # the node (or its request) exists already: filed before a restart
        return Then(Event.QUEUED if w.provider.queued else Event.DONE)
    return None


def filled(w: WatcherApi, inc: Incident, detail: str) -> None:
    capacity.withdraw_others(w, inc)
    recreated(w, inc, detail)


def retry(w: WatcherApi, inc: Incident, detail: str) -> None:
    inc.attempts += 1
    inc.not_before = time.time() + w.config.retry_wait(inc.attempts)
    w.journal.event("error", f"recreate attempt {inc.attempts} failed: {detail}")


def rebuild(w: WatcherApi, inc: Incident, detail: str) -> None:
    w.charge(detail)
    retry(w, inc, detail)


def recreated(w: WatcherApi, inc: Incident, detail: str) -> None:
    w.state.attempt += 1  # the new node boots the job as this attempt
    w.milestone("recreated", inc.started, f"slice {w.provider.name} recreated in "
                f"{w.provider.zone}", attempt=w.state.attempt, cause=inc.kind,
                zone=w.provider.zone)  # fmt: skip


def ready(w: WatcherApi, inc: Incident, detail: str) -> None:
    w.milestone("ready", inc.started, "slice READY")
    w.restarted_now()


def bootstrapped(w: WatcherApi, inc: Incident, detail: str) -> None:
    w.milestone("bootstrapped", inc.started, "bootstrap ok on every worker")
    inc.attempts = 0


def restart(w: WatcherApi, inc: Incident, detail: str, failure: bool = True) -> None:
    """stop and clear-locks on every worker (one round trip), then start-all: every worker
    together, as the next attempt. After a crash the survivors are stuck in a collective and
    ignore SIGTERM: they get a short grace of their own, not the job's (a preemption's save
    time); a hung job gets none."""
    group = w.workers(None)
    inc.started = started = time.time()
    attempt = w.state.attempt + 1
    try:
        stop = None  # a preempted job's own grace: it saves
        if failure:
            hung = inc.kind == "hang"
            stop = w.config.hang_stop_timeout if hung else w.config.failure_stop_timeout
        group.jobctl(STOP_AND_CLEAR, timeout=None, stop_timeout=stop, keep_standby=True)
        w.restarted_now()
        how = starts(group.jobctl("start", attempt=attempt))
    except WorkerError as err:
        w.journal.event("error", f"restart failed: {err}")
        return
    w.state.attempt = attempt
    w.milestone("restarted", started,
                f"job restarted on every worker (attempt {attempt}{how.text()})",
                attempt=attempt, cause=inc.kind, **how.fields())  # fmt: skip


def roll_out(w: WatcherApi, inc: Incident, detail: str) -> None:
    """The node's new bundle onto the running slice, without recreating it: the job stops as
    for a preemption (SIGTERM: it saves, a checkpoint boundary), then every worker's startup
    script runs again: it fetches and verifies the bundle, syncs its environment and starts the
    job, which resumes from that save. A later recreate uses the node's spec as it is now."""
    w.api(w.provider.refresh_spec)  # a TPU API error: journaled, the rollout goes on
    group = w.workers(None)
    inc.started = started = time.time()
    try:
        group.roll_out(w.config.limits.bootstrap, before_start=w.restarted_now)
    except WorkerError as err:  # a failure restart's worth: the budget ends a rollout loop
        w.journal.event("error", f"rollout failed: {err}")
        w.charge(f"rollout failed: {err}")
        return
    bundle = (w.provider.target.metadata.get(BUNDLE_SHA256) or "?")[:12]
    w.milestone("rolled_out", started, f"bundle {bundle} rolled out to every worker",
                bundle=bundle)  # fmt: skip


def open_recreate(w: WatcherApi, inc: Incident, detail: str, failure: bool = False) -> Then:
    if failure:
        w.charge(detail)
    else:
        w.state.preemptions += 1
    inc.not_before = time.time() + w.config.retry_wait(inc.attempts)
    return Then(clock_event(time.time(), inc.not_before))  # due: the delete goes at once


def open_rebuild(w: WatcherApi, inc: Incident, detail: str) -> Then:
    return open_recreate(w, inc, detail, failure=True)


def open_restart(w: WatcherApi, inc: Incident, detail: str) -> Then:
    """A crash or hang on a READY slice (the judge just saw it): charge it, then the restart
    goes at once unless a crash loop backs off (the slice is looked at again when it is due)."""
    bucket = w.store if isinstance(w.store, RemoteState) else None
    capture_hang(w, inc, bucket)  # a hang's stacks, before the restart destroys them
    w.charge(detail)
    inc.not_before = time.time() + w.restart_wait()
    return Then(clock_event(time.time(), inc.not_before))


def restart_free(w: WatcherApi, inc: Incident, detail: str) -> None:
    restart(w, inc, detail, failure=False)


def note_notice(w: WatcherApi, inc: Incident, detail: str) -> None:
    """The incident is open (detected); the node goes PREEMPTED next, or the job restarts after
    the grace: nothing to do yet."""


def note_request(w: WatcherApi, inc: Incident, detail: str) -> None:
    """A queued resource in a state the client cannot name: one line; it is waited on up to
    its deadline (WatchConfig.request_limit), then filed again."""
    w.journal.event("unknown_state", detail, zone=w.provider.zone)


def close(w: WatcherApi, inc: Incident, detail: str) -> None:
    w.close_incident()


def finish(w: WatcherApi, inc: Incident | None, detail: str) -> None:
    """Every worker done: the last line (watch exits 0 after this row)."""
    if w.recovering():
        w.close_incident()
    step = max((p.status.step for p in w.probes if p.status), default=w.state.last_step)
    st = w.state
    w.journal.event("done", f"every worker done at step {step} ({st.preemptions} preemptions, "
                    f"{st.failures} failure restarts)", step=step, preemptions=st.preemptions,
                    failures=st.failures)  # fmt: skip


def stop(w: WatcherApi, inc: Incident, detail: str) -> None:
    """A fatal exit: restarting cannot help, and spot hours are not spent on trying."""
    raise GiveUp(f"the job exited fatally, not restarted: {detail}")


def nothing(w: WatcherApi, inc: Incident | None, detail: str) -> None:
    return None


ACTIONS: dict[Action, Callable[..., Then | None]] = {
    Action.NONE: nothing,
    Action.DELETE: delete,
    Action.CREATE: create,
    Action.STOCKOUT: capacity.stockout,
    Action.QUOTA: capacity.quota,
    Action.REGION_QUOTA: capacity.region_quota,
    Action.QUEUED: capacity.queued,
    Action.FILE_BESIDE: capacity.file_beside,
    Action.KEEP_PLACE: capacity.keep_place,
    Action.FILLED: filled,
    Action.REQUEST_FAILED: capacity.request_failed,
    Action.RETRY: retry,
    Action.REBUILD: rebuild,
    Action.RECREATED: recreated,
    Action.READY: ready,
    Action.BOOTSTRAPPED: bootstrapped,
    Action.RESTART: restart,
    Action.HAND_BACK: nothing,  # the judged phase sees what went wrong next poll
    Action.OPEN_RECREATE: open_recreate,
    Action.OPEN_REBUILD: open_rebuild,
    Action.OPEN_RESTART: open_restart,
    Action.RESTART_FREE: restart_free,
    Action.NOTE_NOTICE: note_notice,
    Action.NOTE_STATE: nothing,  # opening the incident is its one line (`detected`)
    Action.NOTE_REQUEST: note_request,
    Action.CLOSE: close,
    Action.FINISH: finish,
    Action.STOP: stop,
    Action.ROLL_OUT: roll_out,
}
