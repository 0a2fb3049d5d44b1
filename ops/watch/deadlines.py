"""Every deadline, budget and backoff of `tpupod watch`, defined once: the judge reads `Limits`
(ops.watch.judge.CONDITION_DEADLINES names which one a waiting condition has), the waiting
phases read `WatchConfig.phase_deadline`, the CLI's flags fill both."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract.status import STARTING_STATES
from ops.cloud import queued
from ops.fleet.job_status import JobRules
from ops.watch.transitions import Phase

# Seconds, per where the slice runs. GCP: a recreate takes minutes and a TPU program compiles for
# minutes; the local pod: seconds. The dataclasses below default to GCP's; `config_for` applies
# a profile, then the job's spec, then the flags given.
PROFILES: dict[str, dict[str, float]] = {
    "gcp": dict(hang=300.0, start=1800.0, stall=900.0, bootstrap=1800.0, ready=1800.0,
                grace=60.0, capacity=60.0, quota=300.0, patience=1800.0, failed_repair=300.0,
                unknown_state=600.0, spot_maintenance=600.0, step_clock=10.0, step_floor=60.0),
    "local": dict(hang=30.0, start=300.0, stall=60.0, bootstrap=600.0, ready=180.0, grace=30.0,
                  capacity=2.0, quota=2.0, patience=3.0, failed_repair=10.0, unknown_state=20.0,
                  spot_maintenance=60.0, step_clock=3.0, step_floor=2.0),
}  # fmt: skip
GCP = PROFILES["gcp"]


@dataclass(frozen=True)
class Limits:
    """Seconds. `hang`: the heartbeat age that is a frozen process (for a status file that
    carries a heartbeat); `start` and `stall`: the job's startup_timeout_s and hang_after_s."""

    hang: float = GCP["hang"]
    start: float = GCP["start"]  # (re)start -> first progress; also the longest init/compile
    stall: float = GCP["stall"]  # no new step slice-wide after the first (a heartbeat may beat)
    bootstrap: float = GCP["bootstrap"]
    ssh: float = 120.0
    preempt_grace: float = GCP["grace"]  # job preempted but the node stays READY
    transient: float = 1800.0  # CREATING/REPAIRING/... before we recreate anyway
    # Google's UNKNOWN ("unknown state after a failed repair"): not a transition that ends.
    failed_repair: float = GCP["failed_repair"]
    # A state the installed client cannot name (a newer one): the node's, or a queued request's.
    unknown_state: float = GCP["unknown_state"]
    # A spot node's maintenance (health UNHEALTHY_MAINTENANCE) from its start: past it the node
    # counts as lost and is recreated (GCE ends spot VMs for host maintenance).
    spot_maintenance: float = GCP["spot_maintenance"]
    # The step clock (ops.watch.step_clock): a training job with no new step for `step_clock`
    # times its recent median gap between steps is hung, never sooner than `step_floor`. GCP:
    # a real model's steps vary (data, host work), a false hang costs a restart of the slice.
    # The local pod: `tiny` reports a step every ~0.3 s, seen at every poll (~0.5-0.7 s), so
    # a hang is told ~2 s after the job's normal gap (issue 50).
    step_clock: float = GCP["step_clock"]
    step_floor: float = GCP["step_floor"]

    def progress_limit(self, state: str) -> float:
        """How long a state may last without a new step before it counts as a hang."""
        return self.start if state in STARTING_STATES else self.stall


@dataclass
class WatchConfig:
    limits: Limits = field(default_factory=Limits)
    rules: JobRules = field(default_factory=JobRules)  # the job's exit codes, steps, progress
    poll: float = 0.5
    max_failures: int = 3  # F: failure restarts before watch gives up (the job's max_restarts)
    ready_deadline: float = GCP["ready"]  # create done -> READY
    operation_deadline: float = 1800.0  # a delete or create operation
    backoff_base: float = 2.0
    backoff_cap: float = 60.0
    # Each kind of refusal has its budget and backoff (ops.cloud.tpu_errors): capacity is waited for
    # (None: for as long as it takes), quota backed off and named, permission and invalid
    # requests stop at once (GiveUp), the rest (5xx, unreachable) retried on `backoff_*`.
    # The waits count refusals per zone: the next zone in tpupod:zones is tried at once.
    capacity_retries: int | None = None  # stockouts per incident before giving up
    capacity_backoff: float = GCP["capacity"]  # first wait after a stockout, doubling to the cap
    capacity_backoff_cap: float = 600.0
    quota_retries: int | None = 30  # quota refusals per incident before giving up
    quota_backoff: float = GCP["quota"]
    quota_backoff_cap: float = 1800.0
    # A queued resource FAILED for a reason of its own (a bad request, a short reservation):
    # filed again, but only so often per incident (Google: it "may be due to some
    # late-discovered problem with the request itself"); then recovery stops, naming the error.
    request_failure_retries: int = 3
    zone_patience: float = GCP["patience"]  # queued this long in one zone: file the next beside
    queue_deadline: float = float("inf")  # one zone: its own validUntilDuration ends the wait
    ssh_retries: int = 3
    # SIGTERM -> SIGKILL for a crashed job: its survivors are stuck in a collective and ignore
    # SIGTERM (a job's grace_s is for a preemption's save, which these cannot make); they see
    # their peer gone and exit within this (was 3 s: issue 50).
    failure_stop_timeout: float = 1.0
    # A hung job never acts on SIGTERM (its stacks are already kept: ops.fleet.forensics), so
    # its SIGKILL comes with it: a second here was a second of every hang's recovery.
    hang_stop_timeout: float = 0.0

    def phase_deadline(self, phase: Phase) -> float:
        """How long a waiting phase may last before its DEADLINE event (backoffs: no deadline)."""
        return {
            Phase.AWAITING_DELETE: self.operation_deadline,
            Phase.AWAITING_CREATE: self.operation_deadline,
            Phase.AWAITING_READY: self.ready_deadline,
            Phase.AWAITING_BOOTSTRAP: self.limits.bootstrap,
        }.get(phase, float("inf"))

    def request_limit(self, state: str, spread: bool) -> float:
        """How long a queued resource may stay in `state` (its phase times each state): in
        the zone's queue, the zone's patience when a zone of tpupod:zones holds no request of
        ours yet (`spread`); the others as REQUEST_LIMITS says (else an operation's)."""
        if state == queued.WAITING:
            return self.zone_patience if spread else self.queue_deadline
        return self.limit(REQUEST_LIMITS.get(state, "operation_deadline"))

    def limit(self, name: str) -> float:
        """A limit by the name REQUEST_LIMITS and the drawing use: a field of this config, or
        of its Limits (`limits.unknown_state`)."""
        owner, _, field_name = name.rpartition(".")
        return getattr(self.limits if owner else self, field_name)

    def retry_wait(self, attempt: int) -> float:
        return backoff(attempt, self.backoff_base, self.backoff_cap)

    def capacity_wait(self, stockouts: int) -> float:
        return backoff(stockouts, self.capacity_backoff, self.capacity_backoff_cap)

    def quota_wait(self, refusals: int) -> float:
        return backoff(refusals, self.quota_backoff, self.quota_backoff_cap)


# How long a queued resource may stay in a state other than the zone's queue (request_limit).
REQUEST_LIMITS = {"PROVISIONING": "ready_deadline", queued.UNRECOGNIZED: "limits.unknown_state"}


def backoff(attempt: int, base: float = 2.0, cap: float = 60.0) -> float:
    """Seconds to wait before recovery attempt `attempt` (1-based): exponential, capped."""
    return min(cap, base * 2 ** max(0, attempt - 1)) if attempt > 0 else 0.0


def config_for(
    profile: str, job: Any = None, poll: float = 0.5, **given: float | None
) -> WatchConfig:
    """The profile's deadlines, what the job's spec (contract.job.JobSpec) sets, and the flags
    `given` (hang, stall, max_failures, backoff; None: not given), in that order."""
    d = PROFILES[profile]
    limits = Limits(
        hang=given.get("hang") or d["hang"],
        start=(job and job.startup_timeout_s) or d["start"],
        stall=given.get("stall") or (job and job.hang_after_s) or d["stall"],
        bootstrap=d["bootstrap"],
        preempt_grace=d["grace"],
        failed_repair=d["failed_repair"],
        unknown_state=d["unknown_state"],
        spot_maintenance=d["spot_maintenance"],
        step_clock=d["step_clock"],
        step_floor=d["step_floor"],
    )
    max_failures, backoff_s = given.get("max_failures"), given.get("backoff")
    return WatchConfig(
        limits=limits,
        rules=JobRules.of(job) if job else JobRules(),
        poll=poll,
        max_failures=int(
            max_failures if max_failures is not None else (job.max_restarts if job else 3)
        ),
        ready_deadline=d["ready"],
        backoff_base=backoff_s if backoff_s is not None else (job.backoff_s if job else 2.0),
        capacity_backoff=d["capacity"],
        quota_backoff=d["quota"],
        zone_patience=d["patience"],
    )
