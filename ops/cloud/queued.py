"""A slice asked for as a queued resource (Cloud TPU v2 `projects.locations.queuedResources`).

Google recommends creating TPU VMs through queued resources: `nodes.create` fails at once when a
zone has no spot capacity, while a queued request waits in the zone's queue (WAITING_FOR_RESOURCES)
and is filled when capacity frees. The request carries the whole node from the stack's spec
(metadata, service account, network) in `tpu.nodeSpec[0]`, the spot tier when the node is spot,
an optional `queueingPolicy.validUntilDuration` and reservation (a bare name becomes
projects/P/locations/Z/reservations/NAME, the format the TPU API's reservations list uses). Its id is the node's, so one
request per slice, and deleting it with `force` takes its node along: node and request go
together. A SUSPENDED request (its node preempted) cannot be allocated again: it is deleted and
filed anew, as a FAILED one is.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.cloud import tpu_v2
from google.rpc import code_pb2

from ops.cloud.tpu_fields import enum_name, unnamed

# QueuedResourceState.State names, by what recovery does about them.
FILLED = "ACTIVE"
WAITING = "WAITING_FOR_RESOURCES"  # in the zone's queue: no capacity yet
DEAD = {"FAILED", "SUSPENDING", "SUSPENDED", "DELETING", "MISSING"}  # delete it and file again
UNFILLED = "FAILED"  # never filled here (its validUntilDuration passed, or provisioning failed)
MISSING = "MISSING"  # no such request (deleted, or never filed)
UNRECOGNIZED = "UNRECOGNIZED"  # a state the installed client cannot name (ops.cloud.tpu_fields)


@dataclass(frozen=True)
class QueuedStatus:
    state: str  # a QueuedResourceState.State name, MISSING or UNRECOGNIZED
    detail: str = ""
    code: int = 0  # FAILED: failedData.error's code (google.rpc.Code)


def request_for(node: tpu_v2.Node, parent: str, node_id: str, capacity: dict
                ) -> tpu_v2.QueuedResource:  # fmt: skip
    """The queued resource asking for `node`: the spot tier for a spot node (a reserved or
    on-demand node carries its tier in its own schedulingConfig), `valid_for_s` as the queueing
    policy's validUntilDuration, `reservation` as reservationName. Spot is said once, as gcloud
    says it (`queued-resources create --spot`: the tier, and no schedulingConfig on the node)."""
    spot = bool(node.scheduling_config.spot)
    if spot:
        node = tpu_v2.Node(node)  # a copy: the caller's node keeps its schedulingConfig
        del node.scheduling_config
    request = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[
                tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=node_id, node=node)
            ]
        )
    )
    if spot:
        request.spot = tpu_v2.QueuedResource.Spot()
    if capacity.get("valid_for_s"):
        request.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration={"seconds": int(capacity["valid_for_s"])}
        )
    if reservation := capacity.get("reservation"):  # a bare name: the zone's own reservation
        request.reservation_name = reservation if "/" in reservation else (
            f"{parent}/reservations/{reservation}")  # fmt: skip
    return request


def status_of(request: tpu_v2.QueuedResource) -> QueuedStatus:
    state = request.state
    name = enum_name(tpu_v2.QueuedResourceState.State, state.state)
    if name is None:
        return QueuedStatus(UNRECOGNIZED, unnamed("state", state.state))
    error = state.failed_data.error if name == UNFILLED else None
    if error is None or not (error.code or error.message):
        return QueuedStatus(name)
    return QueuedStatus(name, f"{code_name(error.code)}: {error.message}", error.code)


def code_name(code: int) -> str:
    """A google.rpc.Code as Google's bodies spell it (INVALID_ARGUMENT), with its number."""
    try:
        return f"{code_pb2.Code.Name(code)} ({code})"
    except ValueError:
        return f"code {code}"
