"""The local pod's faults: one vocabulary for the demo, the benchmarks and the tests. A kind says
what it does to the pod (`act(pod, notice seconds, worker)`), how to say it, and which incident
kind the watcher reports for it (what a fault plan waits to see recovered)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contract.layout import checkpoint_dir


@dataclass(frozen=True)
class FaultKind:
    what: str  # formatted with notice= and worker=
    incident: str  # ops.watch.conditions.INCIDENT_KINDS for it
    act: Callable[[Any, float, int], object]  # (LocalPod, notice seconds, worker index)
    # What the pod still lacks for the fault to test what it says, or None (a schedule waits):
    # a damaged newest step with no older one behind it tests a refusal, not the fallback.
    lacks: Callable[[Any], str | None] | None = None


def _preempt(pod, notice: float, worker: int) -> object:
    return pod.preempt(notice=notice, wait=False)


def _crash(pod, notice: float, worker: int) -> object:
    return pod.crash(worker)


def _kill_and_damage(pod, notice: float, worker: int) -> dict:
    """A preemption without notice, then the newest verified checkpoint damaged in the bucket
    (its largest state file cut to half), before any new trainer can read it."""
    pod.preempt(notice=0.0, wait=True)
    return _damaged(pod)


def _crash_and_damage(pod, notice: float, worker: int) -> dict:
    """A crash of `worker`'s job with its local copies lost (else the restart reads those and
    never the bucket: tpupod_job.local_tier), then the newest verified checkpoint damaged as
    above. This runs inside one poll of the watch (on_poll), so the restart cannot read the step
    before it is cut; no new step can commit meanwhile (process 0 commits, and the restart stops
    every worker)."""
    pod.crash(worker)
    pod.lose_local_checkpoints(worker)
    return _damaged(pod)


def _damaged(pod) -> dict:
    """Damages the newest committed step; records it and the committed step behind it (the one
    a restore must fall back to). The harness's own requests meet the bucket's injected errors
    too (bench faults --storage-errors), so it tries again, as any GCS client would."""
    error: Exception | None = None
    for _ in range(DAMAGE_TRIES):  # the kill happened: whatever the damage does, it is recorded
        try:
            steps = committed_steps(pod)
            damaged = damage_step(pod, steps[-1]) if steps else None
            return {"damaged": damaged, "behind": steps[-2] if len(steps) > 1 else None}
        except (OSError, ValueError) as err:  # urllib's errors are OSErrors
            error = err
            time.sleep(DAMAGE_RETRY_S)
    return {"damaged": None, "damage_error": f"{error} ({DAMAGE_TRIES} tries)"}


def _bucket(pod) -> tuple[str, str, str]:
    """The pod's GCS emulator URL, bucket, and the operator's token (the harness acts as the
    person at the terminal, who owns the project)."""
    from localpod.gcp.identities import operator_token

    endpoints = pod.endpoints()
    return endpoints["storage"].rstrip("/"), endpoints["bucket"], operator_token(endpoints)


def committed_steps(pod) -> list[int]:
    """The run's committed, verified steps in the pod's bucket, oldest first: those with Orbax's
    commit file and the trainer's manifest (the steps a restore may read)."""
    from contract.checkpoint_manifest import COMMIT_SUCCESS
    from contract.checkpoint_manifest import NAME as MANIFEST
    from localpod.gcp import storage

    url, bucket, token = _bucket(pod)
    prefix = f"{checkpoint_dir(pod.run_prefix)}/"
    files: dict[str, set[str]] = {}
    for o in storage.list_objects(url, bucket, prefix, token):
        step, _, rest = o["name"][len(prefix) :].partition("/")
        if step.isdigit():
            files.setdefault(step, set()).add(rest)
    return sorted(int(step) for step, names in files.items() if {MANIFEST, COMMIT_SUCCESS} <= names)


def lacks_fallback(pod) -> str | None:
    """None when an older committed step stands behind the newest, else what is missing."""
    try:
        steps = committed_steps(pod)
    except (OSError, ValueError) as err:  # urllib's errors are OSErrors; the bucket may 503
        return f"a listing of the checkpoints ({err})"
    return None if len(steps) >= 2 else f"a committed step behind the newest (committed: {steps})"


def damage_step(pod, step: int) -> int | None:
    """Cut the largest file under `step`'s state/ to half its size; returns `step` (None: the
    step has no state files)."""
    from localpod.gcp import storage

    url, bucket, token = _bucket(pod)
    state = storage.list_objects(
        url, bucket, f"{checkpoint_dir(pod.run_prefix)}/{step}/state/", token
    )
    if not state:
        return None
    largest = max(state, key=lambda o: o["size"])
    data = storage.download(url, bucket, largest["name"], token)
    storage.upload(url, bucket, largest["name"], data[: len(data) // 2],
                   "application/octet-stream", token)  # fmt: skip
    return step


def _kill_during_restore(pod, notice: float, worker: int) -> dict:
    """A crash of `worker`'s job, then SIGKILL again once its restart is restoring the newest
    checkpoint (armed first, so the restart cannot begin before the kill is waiting for it)."""
    armed = pod.kill_when(worker, "restoring")
    pod.crash(worker)
    return {"kill_armed": armed["armed"]}


def _crash_while_saving(pod, notice: float, worker: int) -> dict:
    """SIGKILL of `worker`'s job SAVE_KILL_DELAY s after its status next says `saving`: the
    controller reads the status file every 10 ms, where a watcher's poll (0.5 s) saw none of a
    fast machine's saves of `tiny` but the last. Its fault time is the arming; the kill comes at
    the job's next save, within one checkpoint interval."""
    armed = pod.kill_when(worker, "saving", delay=SAVE_KILL_DELAY, same_process=True)
    return {"kill_armed": armed["armed"]}


KINDS: dict[str, FaultKind] = {
    "notice": FaultKind("preemption with {notice:g} s notice (SIGTERM, the job saves, then the "
                        "slice goes)", "preemption", _preempt),
    "kill": FaultKind("preemption without notice (SIGTERM and SIGKILL at once)", "preemption",
                      _preempt),
    "crash": FaultKind("crash (SIGKILL) of worker {worker}'s job (the slice stays)", "crash",
                       _crash),
    "hang": FaultKind("hang (SIGSTOP) of worker {worker}'s job (the slice stays; its heartbeat "
                      "goes stale)", "hang", lambda pod, notice, worker: pod.hang(worker)),
    "save-kill": FaultKind("preemption without notice while a worker's job is saving",
                           "preemption", _preempt),
    "stockout": FaultKind("preemption ({notice:g} s notice), and the slice's zone has no "
                          "capacity for a while: the recreate goes to the next zone",
                          "preemption", lambda pod, notice, worker: (
                              pod.inject_stockout(STOCKOUT_CREATES, zone="node"),
                              _preempt(pod, notice, worker))),
    "damaged-newest": FaultKind("preemption without notice, then the newest checkpoint damaged "
                                "(its largest state file cut to half)", "preemption",
                                _kill_and_damage, lacks_fallback),
    "restore-kill": FaultKind("crash (SIGKILL) of worker {worker}'s job, and SIGKILL again while "
                              "its restart restores the newest checkpoint", "crash",
                              _kill_during_restore),
    "watch-kill": FaultKind("preemption without notice, and the watch dies mid-recovery (a new "
                            "one goes on from incident.json)", "preemption", _preempt),
    # The same hard faults with the slice staying: a restart, not a cold recreate (seconds
    # instead of half a minute on the local pod), so one run of each fits the CI test run.
    "save-crash": FaultKind("crash (SIGKILL) of worker {worker}'s job while it is saving (the "
                            "slice stays)", "crash", _crash_while_saving),
    "watch-crash": FaultKind("crash (SIGKILL) of worker {worker}'s job, and the watch dies "
                             "mid-restart (a new one goes on from incident.json)", "crash",
                             _crash),
    "damaged-crash": FaultKind("crash (SIGKILL) of worker {worker}'s job and its local "
                               "copies lost, then the newest "
                               "checkpoint damaged (its largest state file cut to half)", "crash",
                               _crash_and_damage, lacks_fallback),
}  # fmt: skip
# Creates the slice's zone refuses: a queued resource takes one a second while it waits, so this
# outlasts the local watcher's zone patience (ops.watch.deadlines, 3 s): the next zone's request,
# filed beside the waiting one, is filled first, and the slice moves on.
STOCKOUT_CREATES = 6
# Injected only while a poll saw some worker's job saving (save-crash arms a timed kill instead);
# the watch dies mid-recovery (bench.faults.WatchKilled).
ONLY_WHILE_SAVING = {"save-kill"}
SAVE_KILL_DELAY = 0.05  # s after `saving`: in the save's blocking part or its async writes
KILLS_WATCH = {"watch-kill", "watch-crash"}
# A damage's requests (a listing, a download, an upload) each fail 5 % of the time under the
# campaign's storage errors (an attempt fails ~19 % of the time): 10 tries leave < 1e-7 undone.
DAMAGE_TRIES, DAMAGE_RETRY_S = 10, 0.2


def kind_of(name: str) -> FaultKind:
    if name not in KINDS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(KINDS)}")
    return KINDS[name]


def lacks(pod, name: str) -> str | None:
    """What the pod still lacks for fault `name` (FaultKind.lacks), or None: it can be injected."""
    check = kind_of(name).lacks
    return None if check is None else check(pod)


def describe(name: str, notice: float = 0.0, worker: int = 0) -> str:
    return kind_of(name).what.format(notice=notice, worker=worker)


def inject(pod, name: str, notice: float = 0.0, worker: int = 0) -> object:
    return kind_of(name).act(pod, notice, worker)
