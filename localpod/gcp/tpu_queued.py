"""projects.locations.queuedResources of the pod's Cloud TPU v2 API, as Google defines them.

A queued resource asks for one node (tpu.nodeSpec[0], with its full Node: metadata, service
account, network) in a tier (spot or guaranteed) and is filled when capacity allows: ACCEPTED,
WAITING_FOR_RESOURCES while the pod's injected stockouts last (one consumed per retry), then
PROVISIONING while the slice boots and ACTIVE once its node is READY. A node preempted or gone
after that leaves the request SUSPENDED (it cannot be allocated again: delete it and file a new
one); a request not filled before its queueingPolicy.validUntilDuration, or whose node failed to
boot, is FAILED. `state.state` and its `*Data` member are shaped as google.cloud.tpu_v2 has them.
"""

from __future__ import annotations

import re
import threading
import time

from localpod.gcp.tpu_faults import failure
from localpod.gcp.tpu_nodes import TpuService
from localpod.gcp.tpu_operations import copy, now
from localpod.gcp.tpu_quota import Holder, holder
from localpod.gcp.tpu_requests import ApiError, check_node_id, node_request, not_found
from localpod.state import SliceState

QUEUED_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
RETRY_S = 1.0  # a waiting request tries for capacity again this often
QR_ID = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
GONE = {SliceState.PREEMPTED, SliceState.TERMINATED, SliceState.MISSING}
DATA = {  # state -> its member of QueuedResourceState (WAITING_FOR_RESOURCES has none)
    "CREATING": "creatingData", "ACCEPTED": "acceptedData", "PROVISIONING": "provisioningData",
    "FAILED": "failedData", "DELETING": "deletingData", "ACTIVE": "activeData",
    "SUSPENDING": "suspendingData", "SUSPENDED": "suspendedData",
}  # fmt: skip


def _seconds(duration: object) -> float | None:
    """A google.protobuf.Duration in JSON ("3600s", "1.5s")."""
    if isinstance(duration, str) and duration.endswith("s"):
        try:
            return float(duration[:-1])
        except ValueError:
            pass
    if duration is None:
        return None
    raise ApiError("INVALID_ARGUMENT", f'Invalid duration {duration!r}: expected e.g. "3600s".')


class QueuedResources:
    """The pod's queued resources: any number of requests, at most one node (the pod's slice)."""

    def __init__(self, nodes: TpuService) -> None:
        self.nodes = nodes
        self._lock = threading.RLock()
        self._requests: dict[str, dict] = {}  # name -> record
        nodes.request_holders = self.holders

    # -- the API -----------------------------------------------------------------------------
    def create_queued_resource(self, project: str, zone: str, queued_resource_id: str | None,
                               body: dict) -> dict:  # fmt: skip
        parent = self.nodes.location(project, zone)
        if not queued_resource_id or not QR_ID.fullmatch(queued_resource_id):
            raise ApiError("INVALID_ARGUMENT", f"queuedResourceId {queued_resource_id!r} is "
                           "invalid: lowercase letters, digits and hyphens, at most 63.")  # fmt: skip
        name = f"{parent}/queuedResources/{queued_resource_id}"
        specs = ((body or {}).get("tpu") or {}).get("nodeSpec") or []
        if len(specs) != 1 or not specs[0].get("nodeId"):
            raise ApiError("INVALID_ARGUMENT", "tpu.nodeSpec: exactly one node with a nodeId "
                           "(this pod has one slice; multislice requests are not offered).")  # fmt: skip
        spec = specs[0]
        if spec.get("parent") != parent:
            raise ApiError("INVALID_ARGUMENT", f"tpu.nodeSpec[0].parent must be {parent!r}.")
        check_node_id(spec["nodeId"])
        layout = self.nodes.layout
        request = node_request(spec.get("node") or {}, self.nodes.accelerator,
                               len(layout["addresses"]))  # fmt: skip
        if "spot" in body:  # the tier is the request's: its node is a spot VM
            request["schedulingConfig"] = {**request.get("schedulingConfig", {}), "spot": True}
        until = _seconds((body.get("queueingPolicy") or {}).get("validUntilDuration"))
        with self._lock:
            if name in self._requests:
                raise ApiError("ALREADY_EXISTS", f'Resource "{name}" already exists.')
            self.nodes.check_quota(holder(zone, request))
            record = {
                "name": name, "createTime": now(), "body": body, "request": request,
                "node_name": f"{parent}/nodes/{spec['nodeId']}", "node_id": spec["nodeId"],
                "phase": "ACCEPTED", "error": None, "active": False, "node": None,
                "deadline": time.time() + until if until else None, "answer": None,
            }  # fmt: skip
            self._answer(record, zone)
            self._requests[name] = record
            operation = self.nodes.operations.new(name, "create")
        self._try(record)
        # The response is the request as filed: a state answered later is not in it (strict,
        # the client's operation parser refuses a state name it lacks).
        response = {"@type": QUEUED_TYPE, **self._json(record, answered=False)}
        return self.nodes.operations.finish(operation, {"response": response})

    def get_queued_resource(self, project: str, zone: str, queued_resource_id: str) -> dict:
        return self._json(self._found(project, zone, queued_resource_id))

    def list_queued_resources(self, project: str, zone: str) -> dict:
        self.nodes.location(project, zone, listing=True)
        with self._lock:
            records = [r for r in self._requests.values()
                       if zone in ("-", r["name"].split("/")[3])]  # fmt: skip
        return {"queuedResources": [self._json(r) for r in records]} if records else {}

    def delete_queued_resource(self, project: str, zone: str, queued_resource_id: str,
                               force: bool = False) -> dict:  # fmt: skip
        record = self._found(project, zone, queued_resource_id)

        def forget() -> None:
            with self._lock:
                self._requests.pop(record["name"], None)
            self.nodes.operations.finish(operation, {"response": {"@type": EMPTY_TYPE}})

        with self._lock:  # no retry (_try) boots a node between this check and DELETING
            node = self._live_node(record)
            if node is not None and not force:
                raise ApiError("FAILED_PRECONDITION", f'Queued resource "{record["name"]}" has a '
                               "node; delete the node first, or delete with force.")  # fmt: skip
            operation = self.nodes.operations.new(record["name"], "delete")
            if node is not None:
                try:
                    self.nodes.remove(node, forget)
                except ApiError:  # the slice is busy: the request stays as it was
                    self.nodes.operations.drop(operation)
                    raise
            record["phase"] = "DELETING"
        if node is None:
            forget()
        return copy(operation)

    def reset_queued_resource(self, project: str, zone: str, queued_resource_id: str) -> dict:
        raise ApiError("UNIMPLEMENTED", "queuedResources.reset is not offered by the local pod: "
                       "delete the request and file it again.")  # fmt: skip

    def holders(self) -> list[Holder]:
        """What the requests hold of the quota: every one not deleted, whatever its state.
        Without the lock (one list() of a dict is atomic): nodes.create asks under the
        service's lock, which a request's retry takes under this one."""
        records = list(self._requests.values())
        return [holder(r["name"].split("/")[3], r["request"]) for r in records]

    def _answer(self, record: dict, zone: str) -> None:
        """An answer injected for the next request in `zone` (localpod.gcp.tpu_faults): FAILED at
        once for its reason, or a state served as given while the request waits."""
        answer = self.nodes.faults.take_request_answer(zone)
        if answer is None:
            return
        if "state" in answer:
            record["phase"], record["answer"] = "WAITING_FOR_RESOURCES", answer["state"]
            return
        quota = ""
        if answer["fail"].endswith("quota"):
            scope = "region" if answer["fail"] == "region-quota" else "zone"
            used = holder(zone, record["request"])
            quota = self.nodes.quota.refusal(used, [(scope, self.nodes.quota.limit(scope))]).message
        error = failure(answer["fail"], zone, record["request"]["acceleratorType"], quota)
        record["phase"], record["error"] = "FAILED", error

    # -- states --------------------------------------------------------------------------------
    def _found(self, project: str, zone: str, queued_resource_id: str) -> dict:
        name = f"{self.nodes.location(project, zone)}/queuedResources/{queued_resource_id}"
        with self._lock:
            record = self._requests.get(name)
        if record is None:
            raise not_found(name)
        return record

    def _live_node(self, record: dict) -> dict | None:
        node = record["node"]
        return node if node is not None and self.nodes.live(node["name"]) is node else None

    def _try(self, record: dict) -> None:
        """Capacity now (provision the node), or wait and try again in RETRY_S; under the lock,
        so a request deleted meanwhile never boots a node."""
        with self._lock:
            self._try_locked(record)

    def _try_locked(self, record: dict) -> None:
        if record["phase"] not in ("ACCEPTED", "WAITING_FOR_RESOURCES") or record["answer"]:
            return
        if record["deadline"] is not None and time.time() > record["deadline"]:
            record["phase"], record["error"] = "FAILED", {"code": 4, "message": (
                "the request could not be fulfilled before its validUntilDuration")}  # fmt: skip
            return
        zone = record["name"].split("/")[3]
        if self.nodes.faults.take_stockout(zone) or self.nodes.live() is not None:
            record["phase"] = "WAITING_FOR_RESOURCES"  # no capacity (or the slice is taken)
            timer = threading.Timer(RETRY_S, self._try, [record])
            timer.daemon = True
            timer.start()
            return
        try:
            record["node"] = self.nodes.boot(record["node_name"], record["node_id"],
                                             record["request"], lambda node: None,
                                             owner=record["name"])  # fmt: skip
            record["phase"] = "PROVISIONING"
        except ApiError as err:
            record["phase"], record["error"] = "FAILED", {"code": 9, "message": err.message}

    def _state(self, record: dict) -> str:
        phase = record["phase"]
        if phase != "PROVISIONING":
            return phase
        node = record["node"]
        live = self._live_node(record)
        state = SliceState(self.nodes.slice.describe()["state"]) if live else SliceState.MISSING
        if state == SliceState.READY:
            record["active"] = True
            return "ACTIVE"
        if state in GONE or live is None:
            if record["active"]:
                return "SUSPENDED"  # preempted: this request cannot be allocated again
            detail = self.nodes.slice.describe()["detail"] or f"node {node['name']} {state}"
            record["phase"], record["error"] = "FAILED", {"code": 13, "message": detail}
            return "FAILED"
        return "PROVISIONING"

    def _json(self, record: dict, answered: bool = True) -> dict:
        with self._lock:
            state = self._state(record)
        body = {k: v for k, v in record["body"].items() if k not in ("name", "createTime", "state")}
        out = {**body, "name": record["name"], "createTime": record["createTime"]}
        served = record["answer"] if answered and record["answer"] is not None else state
        out["state"] = {"state": served, "stateInitiator": "USER"}
        if state in DATA:
            data = {"error": record["error"]} if state == "FAILED" and record["error"] else {}
            out["state"][DATA[state]] = data
        return out
