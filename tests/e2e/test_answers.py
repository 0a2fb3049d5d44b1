"""Google's answers that recovery once mishandled (issue 48), each made by the local TPU API on
demand (`tpupod local answer`, localpod.gcp.tpu_faults) and each met by `watch` through the one
recovery table, with Google's client in between: a node state the installed client cannot name
(a new name reads as STATE_UNSPECIFIED, a new number as a bare int), Google's UNKNOWN, a queued
request in a state the client cannot name, and a queued request FAILED for each reason. The
module's pod boots the stand-in script (conftest); every test leaves its slice READY."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from demo.reference import pod_provider
from localpod.pod import LocalPod
from ops.cloud.slice import SliceState
from ops.cloud.tpu_fields import CLIENT
from ops.watch import GiveUp, Limits
from ops.watch.transitions import Phase
from tests.e2e.test_capacity import watcher_for
from tests.e2e.test_provider import CONFIG, drive, phase_is

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
# Deadlines of their own, short; the transient one (30 min) as on GCP: waiting it out would fail.
LIMITS = Limits(bootstrap=60, failed_repair=2.0, unknown_state=2.0, preempt_grace=1.0,
                spot_maintenance=6.0)  # fmt: skip
ANSWERS = dataclasses.replace(CONFIG, limits=LIMITS, quota_backoff=0.5)
# Well past the deadlines above, a recovery beside other pods included; well short of the
# transient one (30 min).
PATIENCE_S = 90.0
ZONE_QUOTA = "TPULocalCPUPreemptiblePerProjectPerZoneForTPUAPI"
REGION_QUOTA = "TPULocalCPUPreemptiblePerProjectPerRegionForTPUAPI"


def events(watcher, name: str) -> list[dict]:
    return [e for e in watcher.journal.events if e["event"] == name]


def recovered(pod: LocalPod, tmp_path: Path):
    """A watcher driven from now until the slice is recreated and bootstrapped."""
    provider = pod_provider(pod.paths.root)
    provider.describe()  # the zone the node is in now (an earlier test may have moved it)
    node_id = provider.client.get_node(name=provider.node_name).id
    watcher = watcher_for(provider, tmp_path, "journal", ANSWERS)
    resumed = phase_is(Phase.AWAITING_RESUME)
    drive(watcher, lambda w: resumed(w) and bool(events(w, "recreated")), timeout=PATIENCE_S)
    watcher.close()
    info = provider.describe()
    assert info.state is SliceState.READY and info.spot  # spot from the request's tier alone
    assert provider.client.get_node(name=provider.node_name).id != node_id  # a new node
    names = [e["event"] for e in watcher.journal.events]
    assert names.count("recreated") == 1 and "gave_up" not in names, names
    return watcher


@pytest.mark.parametrize("state", ["NEWSTATE", "99"])
def test_a_node_state_the_client_cannot_name_is_one_line_then_a_recreate(pod, tmp_path, state):
    """Before: a new name waited the transient 30 minutes as UNKNOWN; a number raised
    ValueError in ops.cloud.tpu and the watcher exited 1 (restarted every 5 s, never recovering)."""
    pod.answer_node(state=state)
    watcher = recovered(pod, tmp_path)
    detected = events(watcher, "detected")
    assert [e["kind"] for e in detected] == ["unknown-state"], detected
    message = detected[0]["message"]
    assert "UNRECOGNIZED" in message and CLIENT in message and "unknown_state" in message
    assert ("state 99" in message) == (state == "99")
    lost = [e for e in events(watcher, "transition") if e["on"] == "slice-lost"]
    assert len(lost) == 1


def test_googles_unknown_is_recreated_after_its_own_deadline(pod, tmp_path) -> None:
    """UNKNOWN: "unknown state after a failed repair". Before: the transient 30 minutes."""
    pod.answer_node(state="UNKNOWN")
    watcher = recovered(pod, tmp_path)
    detected = events(watcher, "detected")
    assert [e["kind"] for e in detected] == ["unknown-state"]
    assert "slice UNKNOWN" in detected[0]["message"] and "failed_repair" in detected[0]["message"]


@pytest.mark.parametrize("state", ["NEWSTATE", "99"])
def test_a_queued_request_in_a_state_the_client_cannot_name_is_filed_again(pod, tmp_path, state):
    """The request recovery files answers a state the client cannot name and is never filled:
    one line, its own deadline, then it is filed again (before: a number raised ValueError in
    ops.cloud.queued; a name waited an operation's deadline as STATE_UNSPECIFIED)."""
    pod.answer_requests(state=state)
    pod.preempt(notice=0)
    watcher = recovered(pod, tmp_path)
    said = events(watcher, "unknown_state")
    assert len(said) == 1 and CLIENT in said[0]["message"], [e["message"] for e in said]
    assert "filing it again" in said[0]["message"]
    assert len(events(watcher, "queued")) == 2


@pytest.mark.parametrize(
    ("kind", "named", "moves"), [("quota", ZONE_QUOTA, True), ("region-quota", REGION_QUOTA, False)]
)
def test_a_request_failed_for_quota_backs_off_where_another_zone_can_help(
    pod, tmp_path, kind, named, moves
) -> None:
    """FAILED with a quota named: the quota's budget and backoff, in the next zone for a zone's
    quota and in place for a region's (before: every FAILED counted as a stockout)."""
    here = pod_provider(pod.paths.root).describe().zone
    pod.answer_requests(fail=kind, zone=here)
    pod.preempt(notice=0)
    watcher = recovered(pod, tmp_path)
    quota = events(watcher, "quota")
    assert len(quota) == 1 and named in quota[0]["message"], quota
    assert quota[0]["zone"] == here and (quota[0]["next_zone"] != here) == moves
    assert (watcher.state.incident.quota_refusals, watcher.state.incident.stockouts) == (1, 0)
    assert [e["zone"] for e in events(watcher, "recreated")] == [quota[0]["next_zone"]]


def test_a_request_failed_for_capacity_keeps_trying(pod, tmp_path) -> None:
    """Past the budget of a request's own failures, a stockout is still no failure (a guard:
    this was right before too)."""
    failures = ANSWERS.request_failure_retries + 1
    pod.answer_requests(fail="stockout", count=failures)
    pod.preempt(notice=0)
    watcher = recovered(pod, tmp_path)
    assert len(events(watcher, "stockout")) == failures


@pytest.mark.parametrize(("kind", "said"), [("invalid", "INVALID_ARGUMENT (3): Cloud TPU received "
                                             "a bad request"),
                                            ("reservation", "FAILED_PRECONDITION (9): Insufficient "
                                             "reserved capacity")])  # fmt: skip
def test_a_request_failed_for_its_own_reason_has_a_small_budget_then_one_line(
    pod_factory, tmp_path, kind, said
) -> None:
    """Filed again up to request_failure_retries times, then recovery stops, naming the error
    (before: counted as a stockout and filed again forever)."""
    local = pod_factory()
    local.up()
    provider = pod_provider(local.paths.root)
    provider.zones = [provider.zone]
    local.answer_requests(fail=kind, count=10)
    watcher = watcher_for(provider, tmp_path, "journal", ANSWERS)
    local.preempt(notice=0)
    with pytest.raises(GiveUp) as gave_up:
        drive(watcher, lambda w: False, timeout=PATIENCE_S)
    watcher.close()
    budget = ANSWERS.request_failure_retries
    assert f"FAILED {budget + 1} times" in str(gave_up.value) and said in str(gave_up.value)
    errors = [e["message"] for e in events(watcher, "error")]
    assert len(errors) == budget and all(said in m for m in errors), errors
    assert "stockout" not in [e["event"] for e in watcher.journal.events]


def test_a_spot_node_under_maintenance_is_restarted_in_place_once_then_recreated(
    pod, tmp_path
) -> None:
    """Health UNHEALTHY_MAINTENANCE on a spot node that keeps running: the notice's grace, one
    in-place restart for this maintenance event, and past spot_maintenance the node counts as
    lost (before: restarted in place every grace period for as long as the health lasted)."""
    pod.answer_node(health="UNHEALTHY_MAINTENANCE")
    watcher = recovered(pod, tmp_path)
    moves = events(watcher, "transition")
    restarts = [(m["on"], m["action"]) for m in moves if m["action"] == "restart-free"]
    assert restarts == [("spot-maintenance", "restart-free")], restarts
    tried = events(watcher, "restarted") + [e for e in events(watcher, "error")
                                            if "restart failed" in e["message"]]  # fmt: skip
    assert len(tried) == 1, [e["message"] for e in watcher.journal.events]
    assert [m["on"] for m in moves if m["action"] == "open-recreate"] == ["slice-lost"]
    assert [e["kind"] for e in events(watcher, "detected")] == ["preemption"]
