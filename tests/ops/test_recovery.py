"""The judge (ops.watch.judge, ops.watch.conditions), row by row: no I/O, no clock."""

from __future__ import annotations

import pytest

from contract.metadata import BUNDLE_SHA256
from contract.status import JobStatus
from ops.cloud.slice import SliceInfo, SliceState
from ops.fleet.job_status import JobRules
from ops.fleet.probe import Probe
from ops.watch import judge as the_judge
from ops.watch.conditions import SLICE_ACTIONS, SliceAction, WorkerCondition, judge_worker
from ops.watch.deadlines import PROFILES, Limits, backoff, config_for
from ops.watch.judge import CONDITION_DEADLINES, ON_DEADLINE
from ops.watch.transitions import Event


def decide(state, probes, since, waited, limits, health=None, *, rules=None, run_step=None,
           bundle=None, spot=True, detail=None):  # fmt: skip
    """The judge's `decide`, handed the slice as the TPU API would describe it."""
    metadata = {BUNDLE_SHA256: bundle} if bundle else {}
    seen = SliceInfo(state, health=health, detail=detail, metadata=metadata, spot=spot)
    return the_judge.decide(seen, probes, since, waited, limits, rules, run_step)


NOW = 10_000.0
SINCE = 9_000.0
LIMITS = Limits(hang=30, start=300, stall=100, bootstrap=600, ssh=60, preempt_grace=20)
OK = {"state": "ok", "phase": "start-job"}
RULES = JobRules()  # the defaults: 75 preempted, 2 fatal, no steps declared


def never(_key):
    return 0.0


def forever(_key):
    return 1e9


def probe(index=0, state="training", age=1.0, step=10, beat=True, **kw) -> Probe:
    """A worker whose status was written `age` s ago; `beat`: with the built-in trainer's
    heartbeat (a thread's), else as tpupod_job.progress() writes it (at steps only)."""
    status = JobStatus(step=step, state=state, updated=NOW - age,
                       heartbeat=NOW - age if beat else None)  # fmt: skip
    return Probe(index, bootstrap=kw.pop("bootstrap", OK), status=status, now=NOW, **kw)


def judge(p: Probe, rules: JobRules = RULES, **kw) -> WorkerCondition:
    return judge_worker(p, SINCE, LIMITS, rules, **kw).condition


def test_every_slice_state_has_a_row():
    assert set(SLICE_ACTIONS) == set(SliceState)


@pytest.mark.parametrize(
    ("state", "action"),
    [
        (SliceState.CREATING, Event.CALM),
        (SliceState.READY, Event.CALM),  # healthy workers: keep watching
        (SliceState.RESTARTING, Event.CALM),
        (SliceState.REPAIRING, Event.CALM),
        (SliceState.STOPPING, Event.CALM),
        (SliceState.STOPPED, Event.SLICE_LOST),
        (SliceState.STARTING, Event.CALM),
        (SliceState.PREEMPTED, Event.SLICE_LOST),
        (SliceState.TERMINATED, Event.SLICE_LOST),
        (SliceState.DELETING, Event.CALM),
        (SliceState.MISSING, Event.SLICE_LOST),
        (SliceState.UNKNOWN, Event.UNKNOWN_STATE),  # Google's, after a failed repair
        (SliceState.UNRECOGNIZED, Event.UNKNOWN_STATE),  # one the client cannot name
    ],
)
def test_slice_state_to_action(state, action):
    assert decide(state, [probe(0), probe(1)], SINCE, never, LIMITS).event is action


@pytest.mark.parametrize("state", [s for s, a in SLICE_ACTIONS.items() if a is SliceAction.WAIT])
def test_a_transition_stuck_past_its_deadline_is_recreated(state):
    assert decide(state, [], SINCE, forever, LIMITS).event is Event.SLICE_LOST


@pytest.mark.parametrize(
    ("state", "limit"), [(SliceState.UNKNOWN, "failed_repair"),
                         (SliceState.UNRECOGNIZED, "unknown_state")])  # fmt: skip
def test_a_state_with_a_deadline_of_its_own_is_recreated_after_it_not_the_transient_one(
    state, limit
):
    """Found in issue 48: Google's UNKNOWN and a state the client cannot name waited the
    transient 30 minutes; each now has its own named deadline (ops.watch.deadlines)."""
    limits = Limits(transient=1800, failed_repair=300, unknown_state=600)
    within = decide(state, [], SINCE, lambda _: getattr(limits, limit) - 1, limits, detail="99")
    assert within.event is Event.UNKNOWN_STATE and limit in within.reason and "99" in within.reason
    past = decide(state, [], SINCE, lambda _: getattr(limits, limit) + 1, limits)
    assert past.event is Event.SLICE_LOST and limit in past.reason


@pytest.mark.parametrize(
    ("p", "condition"),
    [
        (Probe(0, reachable=False, error="refused"), WorkerCondition.UNREACHABLE),
        (Probe(0, bootstrap=None, now=NOW), WorkerCondition.BOOTSTRAPPING),
        (Probe(0, bootstrap={"state": "running"}, now=NOW), WorkerCondition.BOOTSTRAPPING),
        (Probe(0, bootstrap={"state": "failed"}, now=NOW), WorkerCondition.BOOTSTRAP_FAILED),
        (Probe(0, bootstrap=OK, now=NOW), WorkerCondition.STARTING),
        (probe(age=NOW - SINCE + 5), WorkerCondition.STARTING),  # status of the previous run
        (probe(), WorkerCondition.RUNNING),
        (probe(age=31), WorkerCondition.HUNG),
        # the heartbeat comes from a thread: frozen in any state is a hang
        (probe(state="compiling", age=10), WorkerCondition.RUNNING),
        (probe(state="compiling", age=31), WorkerCondition.HUNG),
        (probe(state="saving", age=31), WorkerCondition.HUNG),
        (probe(alive=False), WorkerCondition.FAILED),
        (probe(state="failed"), WorkerCondition.FAILED),
        (probe(state="done"), WorkerCondition.DONE),
        (probe(state="preempted"), WorkerCondition.PREEMPTED),
        (probe(preempted_flag=True), WorkerCondition.PREEMPTED),
        (probe(exit_code=1, exit_mtime=NOW, alive=False), WorkerCondition.FAILED),
        (probe(exit_code=137, exit_mtime=NOW, alive=False), WorkerCondition.FAILED),
        (probe(exit_code=75, exit_mtime=NOW, alive=False), WorkerCondition.PREEMPTED),
        (probe(exit_code=0, exit_mtime=NOW, alive=False), WorkerCondition.DONE),
        (probe(exit_code=1, exit_mtime=SINCE - 1), WorkerCondition.RUNNING),  # stale exit file
        (probe(exit_code=2, exit_mtime=NOW, alive=False), WorkerCondition.FATAL),
        # exit 0 after a SIGTERM to the job's group, or under a preemption notice: not done
        (
            probe(exit_code=0, exit_mtime=NOW, alive=False, term_at=NOW - 3),
            WorkerCondition.PREEMPTED,
        ),
        (
            probe(exit_code=0, exit_mtime=NOW, alive=False, preempted_flag=True),
            WorkerCondition.PREEMPTED,
        ),  # fmt: skip
        (probe(exit_code=0, exit_mtime=NOW, alive=False, term_at=SINCE - 1), WorkerCondition.DONE),
        (
            probe(exit_code=2, exit_mtime=NOW, alive=False, term_at=NOW - 3),
            WorkerCondition.PREEMPTED,
        ),
        # no heartbeat (a job's own status file): judged by the slice's progress alone
        (probe(age=200, beat=False), WorkerCondition.RUNNING),
        (probe(age=200, beat=False, progress_age=101), WorkerCondition.HUNG),
    ],
)
def test_worker_condition(p, condition):
    assert judge(p) is condition


@pytest.mark.parametrize(
    ("code", "rules", "condition"),
    [
        (75, JobRules(preempted=frozenset(), fatal=frozenset({3})), WorkerCondition.FAILED),
        (3, JobRules(preempted=frozenset(), fatal=frozenset({3})), WorkerCondition.FATAL),
        (2, JobRules(preempted=frozenset(), fatal=frozenset({3})), WorkerCondition.FAILED),
        (42, JobRules(preempted=frozenset({42})), WorkerCondition.PREEMPTED),
    ],
)
def test_a_jobs_own_exit_codes(code, rules, condition):
    assert judge(probe(exit_code=code, exit_mtime=NOW, alive=False), rules) is condition


def test_a_worker_that_reports_nothing_is_watched_by_liveness():
    silent = Probe(1, bootstrap=OK, alive=True, now=NOW)
    assert judge(silent) is WorkerCondition.STARTING  # nobody reports yet: starting
    assert judge(silent, slice_reports=True) is WorkerCondition.RUNNING  # process 0 does
    no_progress = JobRules(reports_progress=False)
    assert judge(silent, no_progress) is WorkerCondition.RUNNING
    silent.alive = False
    assert judge(silent, no_progress) is WorkerCondition.FAILED


@pytest.mark.parametrize(
    ("probes", "waited", "action", "condition"),
    [
        ([probe(0), probe(1)], never, Event.CALM, WorkerCondition.RUNNING),
        ([probe(0), probe(1, alive=False)], never, Event.JOB_FAILED, WorkerCondition.FAILED),
        ([probe(0), probe(1, age=99)], never, Event.JOB_FAILED, WorkerCondition.HUNG),
        # a crash outranks a preemption notice elsewhere
        (
            [probe(0, state="preempted"), probe(1, state="failed")],
            never,
            Event.JOB_FAILED,
            WorkerCondition.FAILED,
        ),
        ([probe(0, state="preempted"), probe(1)], never, Event.NOTICE, None),
        ([probe(0, state="preempted")], forever, Event.JOB_PREEMPTED, None),
        ([probe(0, state="done"), probe(1)], never, Event.CALM, None),
        (
            [probe(0, state="done"), probe(1, state="done")],
            never,
            Event.ALL_DONE,
            WorkerCondition.DONE,
        ),
        ([Probe(0, reachable=False, error="x")], never, Event.CALM, None),
        ([Probe(0, reachable=False, error="x")], forever, Event.UNUSABLE, None),
        ([Probe(0, bootstrap={"state": "failed"})], never, Event.UNUSABLE, None),
        ([Probe(0, bootstrap={"state": "running"})], forever, Event.UNUSABLE, None),
        ([Probe(0, bootstrap=OK, now=NOW)], forever, Event.JOB_FAILED, None),
        (
            [probe(0, exit_code=2, exit_mtime=NOW, alive=False), probe(1, alive=False)],
            never,
            Event.FATAL,
            WorkerCondition.FATAL,
        ),
        # only process 0 reports: the other is judged alive by its process
        ([probe(0), Probe(1, bootstrap=OK, alive=True, now=NOW)], never, Event.CALM, None),
    ],
)
def test_slice_wide_decision(probes, waited, action, condition):
    decision = decide(SliceState.READY, probes, SINCE, waited, LIMITS, rules=RULES)
    assert decision.event is action
    if condition is not None:
        assert decision.condition is condition


def done(index: int, step: int) -> Probe:
    return probe(index, step=step, exit_code=0, exit_mtime=NOW, alive=False)


def test_done_needs_every_worker_at_the_declared_steps():
    rules = JobRules(steps=20)
    early = decide(SliceState.READY, [done(0, 12), done(1, 12)], SINCE, never, LIMITS, rules=rules)
    assert (early.event, early.condition) == (Event.JOB_FAILED, WorkerCondition.FAILED)
    assert "before its 20 steps" in early.reason
    last = decide(SliceState.READY, [done(0, 20), done(1, 20)], SINCE, never, LIMITS, rules=rules)
    assert last.event is Event.ALL_DONE
    # An attempt that restored the last step and exited at once reports no step of its own:
    # the run's newest step decides.
    quiet = [
        probe(i, exit_code=0, exit_mtime=NOW, alive=False, age=NOW - SINCE + 5) for i in (0, 1)
    ]
    for run_step, action in (
        (20, Event.ALL_DONE),
        (12, Event.JOB_FAILED),
        (None, Event.JOB_FAILED),
    ):
        got = decide(SliceState.READY, quiet, SINCE, never, LIMITS, rules=rules, run_step=run_step)
        assert got.event is action, (run_step, got)
    silent = JobRules(steps=20, reports_progress=False)  # no progress: exit 0 everywhere is done
    assert decide(SliceState.READY, [done(0, 3)], SINCE, never, LIMITS, rules=silent).event is (
        Event.ALL_DONE
    )


def test_maintenance_health_is_a_preemption_notice_on_a_spot_node():
    """A notice, then (past the grace) the one in-place restart of the maintenance event, then
    (past spot_maintenance, timed from the event's start) a lost slice. Found in issue 48: it
    was JOB_PREEMPTED, restarted in place every grace period for as long as it lasted."""

    def at(seconds):
        return decide(SliceState.READY, [probe()], SINCE, lambda key: seconds, LIMITS,
                      "UNHEALTHY_MAINTENANCE")  # fmt: skip

    d = at(0.0)
    assert (d.event, d.condition, d.key) == (Event.NOTICE, WorkerCondition.PREEMPTED, "maintenance")
    assert at(LIMITS.preempt_grace + 1).event is Event.SPOT_MAINTENANCE
    assert at(LIMITS.spot_maintenance + 1).event is Event.SLICE_LOST
    from ops.watch.transitions import Phase, advance

    assert advance(Phase.WATCHING, Event.SPOT_MAINTENANCE).phase is Phase.AWAITING_RESUME
    assert advance(Phase.AWAITING_RESUME, Event.SPOT_MAINTENANCE) is None  # once per event


def test_maintenance_of_an_on_demand_node_is_waited_for_not_restarted_over_ssh():
    """It comes back by itself and its startup script starts the job: no notice, no restart,
    whatever the workers look like meanwhile; only a maintenance that outlasts the transient
    deadline counts as a lost slice."""
    dead = [probe(0, alive=False), probe(1, age=999)]  # crashed and hung, as a reboot leaves them
    for waited in (never, lambda key: LIMITS.preempt_grace + 1):
        d = decide(SliceState.READY, dead, SINCE, waited, LIMITS, "UNHEALTHY_MAINTENANCE",
                   spot=False)  # fmt: skip
        assert (d.event, d.condition, d.key) == (Event.CALM, None, "maintenance"), d
    d = decide(SliceState.READY, dead, SINCE, forever, LIMITS, "UNHEALTHY_MAINTENANCE", spot=False)
    assert d.event is Event.SLICE_LOST
    healthy_again = decide(SliceState.READY, dead, SINCE, never, LIMITS, None, spot=False)
    assert healthy_again.event is Event.JOB_FAILED  # judged as usual once the node is back


def test_backoff_grows_and_is_capped():
    assert [backoff(n, 1.0, 5.0) for n in range(5)] == [0.0, 1.0, 2.0, 4.0, 5.0]


def test_a_trainer_without_progress_is_hung_even_with_a_fresh_heartbeat():
    stuck = probe(state="saving", age=1, progress_age=LIMITS.stall + 1)
    assert judge(stuck) is WorkerCondition.HUNG
    compiling = probe(state="compiling", age=1, progress_age=200)  # < start
    assert judge(compiling) is WorkerCondition.RUNNING
    compiling.progress_age = 301
    assert judge(compiling) is WorkerCondition.HUNG
    # a restore of a large checkpoint is a starting state too: the start limit, not the stall
    restoring = probe(state="restoring", age=1, progress_age=LIMITS.stall + 1)
    assert judge(restoring) is WorkerCondition.RUNNING
    restoring.progress_age = LIMITS.start + 1
    assert judge(restoring) is WorkerCondition.HUNG


def test_every_waiting_condition_has_one_deadline_and_one_event_after_it():
    assert set(CONDITION_DEADLINES) == set(ON_DEADLINE)
    assert all(hasattr(Limits(), name) for name in CONDITION_DEADLINES.values())


def test_deadlines_come_from_the_profile_then_the_job_then_the_flags():
    class Spec:  # the fields of contract.job.JobSpec that watch reads
        startup_timeout_s, hang_after_s, max_restarts, backoff_s = 120, 45, 5, 7.0
        steps, progress, hang_stacks = 100, "status", "native"
        exit_codes = type("Codes", (), {"preempted": [75], "fatal": [2]})

    local = config_for("local")
    assert (local.limits.hang, local.limits.stall, local.ready_deadline) == (
        PROFILES["local"]["hang"], PROFILES["local"]["stall"], PROFILES["local"]["ready"])  # fmt: skip
    assert config_for("gcp").limits == Limits()  # the dataclass defaults are GCP's profile
    job = config_for("gcp", Spec)
    assert job.rules.native_stacks and not config_for("gcp").rules.native_stacks
    assert (job.limits.start, job.limits.stall, job.max_failures, job.backoff_base) == (
        120, 45, 5, 7.0)  # fmt: skip
    flags = config_for("gcp", Spec, hang=9.0, stall=11.0, max_failures=0, backoff=0.5)
    assert (flags.limits.hang, flags.limits.stall, flags.max_failures, flags.backoff_base) == (
        9.0, 11.0, 0, 0.5)  # fmt: skip


def test_a_bundle_the_workers_do_not_run_is_rolled_out_only_onto_a_calm_slice_that_says_its():
    def booted(index, bundle, **kw):
        return probe(index, bootstrap={**OK, "bundle_sha256": bundle}, **kw)

    new, old = "b" * 64, "a" * 64
    d = decide(SliceState.READY, [booted(0, old), booted(1, old)], SINCE, never, LIMITS,
               bundle=new)  # fmt: skip
    assert d.event is Event.NEW_BUNDLE and old[:12] in d.reason and new[:12] in d.reason
    same = decide(SliceState.READY, [booted(0, new), booted(1, new)], SINCE, never, LIMITS,
                  bundle=new)  # fmt: skip
    assert same.event is Event.CALM
    # A bootstrap that names no bundle is not tpupod's startup script: nothing to roll out onto.
    unnamed = decide(SliceState.READY, [booted(0, old), probe(1)], SINCE, never, LIMITS,
                     bundle=new)  # fmt: skip
    assert unnamed.event is Event.CALM
    # A worker in trouble is recovered first; the rollout waits for a calm slice.
    crashed = decide(SliceState.READY, [booted(0, old), booted(1, old, alive=False)], SINCE,
                     never, LIMITS, bundle=new)  # fmt: skip
    assert crashed.event is Event.JOB_FAILED


@pytest.mark.parametrize(
    ("state", "waited", "zones", "event"),
    [
        ("ACTIVE", 99.0, 1, Event.DONE),
        ("SUSPENDED", 0.0, 1, Event.GONE),  # preempted: delete it and file anew
        ("FAILED", 0.0, 1, Event.STOCKOUT),  # never filled here: the next zone, a budget spent
        ("MISSING", 0.0, 1, Event.GONE),
        ("ACCEPTED", 5.0, 1, Event.RUNNING),
        ("ACCEPTED", 31.0, 1, Event.DEADLINE),  # an operation's limit
        ("WAITING_FOR_RESOURCES", 5.0, 2, Event.RUNNING),
        ("WAITING_FOR_RESOURCES", 11.0, 2, Event.PATIENCE),  # past it: the next zone beside
        ("WAITING_FOR_RESOURCES", 1e6, 1, Event.RUNNING),  # one zone: the queue is the wait
        ("PROVISIONING", 19.0, 2, Event.RUNNING),  # capacity found: patience was the queue's
        ("PROVISIONING", 21.0, 2, Event.DEADLINE),  # as a create's node to READY
        ("UNRECOGNIZED", 39.0, 1, Event.RUNNING),  # a state the client cannot name: its own
        ("UNRECOGNIZED", 41.0, 1, Event.DEADLINE),  # deadline, then filed anew
    ],
)
def test_a_queued_resource_state_is_one_event_timed_per_state(state, waited, zones, event):
    from ops.watch.deadlines import WatchConfig
    from ops.watch.judge import request_event

    config = WatchConfig(zone_patience=10.0, ready_deadline=20.0, operation_deadline=30.0,
                         limits=Limits(unknown_state=40.0))  # fmt: skip
    spread = zones > 1  # a zone holds no request of ours yet
    limit = config.request_limit(state, spread)
    assert request_event(state, waited, limit, spread=spread) is event


def test_refusals_back_off_per_zone_each_kind_on_its_own_budget():
    """Capacity has no limit by default, quota one; a zone not refused yet is tried at once."""
    config = config_for("gcp")
    assert config.capacity_retries is None and config.quota_retries == 30
    assert config.capacity_wait(0) == config.quota_wait(0) == 0.0
    assert config.capacity_wait(1) == PROFILES["gcp"]["capacity"]
    assert config.quota_wait(1) == PROFILES["gcp"]["quota"] > config.capacity_wait(1)
    assert config.quota_wait(20) == config.quota_backoff_cap


def test_a_newly_filed_request_is_timed_afresh_not_from_the_last_ones_wait():
    """Moving on from a zone whose request waited out its patience files a new request that is
    first seen in the same state: it gets its own patience (found in review)."""
    import time
    from types import SimpleNamespace

    from ops.cloud import queued
    from ops.watch import capacity, observe
    from ops.watch.deadlines import WatchConfig
    from ops.watch.incident import Incident

    provider = SimpleNamespace(zone="b", zones=["a", "b"], request_status=lambda zone=None: (
        queued.QueuedStatus(queued.WAITING)))  # fmt: skip
    journal = SimpleNamespace(event=lambda *a, **k: None)
    w = SimpleNamespace(provider=provider, journal=journal, config=WatchConfig(zone_patience=10.0),
                        api=lambda call: call())  # fmt: skip
    inc = Incident("preemption", "", 0.0, 0, request_state=queued.WAITING,
                   request_since=time.time() - 60)  # fmt: skip
    capacity.queued(w, inc, "")
    assert observe.request(w, inc, 0.0, float("inf"))[0] is Event.RUNNING
    inc.request_since -= 11  # this request's own patience spent: zone a's turn, beside it
    assert observe.request(w, inc, 0.0, float("inf"))[0] is Event.PATIENCE


def test_a_status_that_says_failed_with_a_fatal_code_is_fatal_before_the_process_exits():
    """The trainer writes `failed` with its exit code, then exits, which is not instant.
    Seen in that window the worker was judged a crash and restarted 16 times (the
    100-fault campaign's leg 4); the status's own code decides now. A code the job does not call
    fatal, or a `failed` under a preemption notice, stays what it was (negative controls)."""
    exiting = probe(state="failed", alive=True)
    exiting.status.exit_code = 2
    assert judge(exiting) is WorkerCondition.FATAL
    assert judge(exiting, JobRules(preempted=frozenset(), fatal=frozenset({3}))) is (
        WorkerCondition.FAILED
    )
    exiting.status.exit_code = 1
    assert judge(exiting) is WorkerCondition.FAILED
    noticed = probe(state="failed", alive=True, preempted_flag=True)
    noticed.status.exit_code = 2
    assert judge(noticed) is not WorkerCondition.FATAL


@pytest.mark.parametrize(
    ("failure", "event"),
    [("stockout", Event.STOCKOUT), ("quota", Event.QUOTA), ("region-quota", Event.REGION_QUOTA),
     ("other", Event.REQUEST_FAILED)],
)  # fmt: skip
def test_a_failed_queued_resource_is_judged_by_its_error(failure, event):
    """Found in issue 48: every FAILED request counted as a stockout and was filed forever."""
    from ops.watch.judge import request_event

    assert request_event("FAILED", 0.0, 10.0, failure=failure) is event
