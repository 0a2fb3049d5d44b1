"""projects.locations.nodes and .operations of the pod's Cloud TPU v2 API, as Google defines them.

Backed by the pod's one `Slice`: a node exists while the slice does, and create / delete are
long-running operations that finish when the slice reaches READY / MISSING. Field names, enum
values and operation shapes follow google.cloud.tpu_v2; `localpod.gcp.tpu_api` serves this over HTTP.
A create names the pod's own `cpu-N` or a real type of `infra.catalog` (v4-32, v5litepod-16, ...)
whose host count is the pod's worker count: each worker plays one host, with the pod's CPU devices.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable

from localpod.gcp.tpu_faults import STOCKOUT, TpuFaults
from localpod.gcp.tpu_operations import Operations, copy, now
from localpod.gcp.tpu_quota import Holder, Quota, holder
from localpod.gcp.tpu_requests import ApiError, check_node_id, node_request, not_found
from localpod.state import PodError, SliceState
from localpod.vm.environment import accelerator_type
from localpod.vm.metadata_server import PROJECT_ID, ZONES, Node
from localpod.vm.slice import Slice

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
NODE_PORT = 8470  # networkEndpoints[].port on Cloud TPU
STOCKOUT_DELAY_S = 0.2  # a stockout is reported by the operation, a moment after the call
RPC_CODE = {"RESOURCE_EXHAUSTED": 8, "INTERNAL": 13}
# nodes.patch: the fields UpdateNodeRequest.update_mask may name (google.cloud.tpu_v2), as the
# REST mask spells them; the local pod has no external IPs to switch on.
PATCHABLE = ("description", "tags", "labels", "metadata")
NOT_HERE = ("networkConfig.enableExternalIps", "network_config.enable_external_ips")
# Where a state's detail is worth telling the client (healthDescription).
TELL_DETAIL = {SliceState.PREEMPTED, SliceState.TERMINATED}


def _gce_node(node_id: str, zone: str, request: dict) -> dict:
    """What the workers' metadata server tells about the node (tpu-env, service account)."""
    scheduling = request.get("schedulingConfig") or {}
    account = request.get("serviceAccount") or {}
    default = Node()
    return {
        "node_id": node_id,
        "zone": zone,
        "runtime_version": request.get("runtimeVersion", ""),
        "preemptible": bool(scheduling.get("spot") or scheduling.get("preemptible")),
        "service_account": account.get("email") or default.service_account,
        "scopes": list(account.get("scope") or default.scopes),
    }


class TpuService:
    """projects.locations.nodes and .operations for one pod: at most one node, its slice."""

    def __init__(self, slice_: Slice, layout: dict, quota: Quota | None = None) -> None:
        self.slice = slice_
        self.layout = layout
        self.accelerator = accelerator_type(len(layout["addresses"]), layout["devices_per_worker"])
        self._lock = threading.RLock()
        self._node: dict | None = None  # {"id", "name", "createTime", "request", "owner"}
        self.operations = Operations()
        self.faults = TpuFaults()
        self.quota = quota or Quota()
        # What the queued requests hold (localpod.gcp.tpu_queued sets it): quota counts them too.
        self.request_holders: Callable[[], list[Holder]] = list

    # -- names -------------------------------------------------------------------------------
    def location(self, project: str, zone: str, listing: bool = False) -> str:
        if project not in (PROJECT_ID, "1234"):
            raise ApiError(
                "PERMISSION_DENIED", f'Permission denied on resource project "{project}".'
            )
        if zone not in ZONES and not (listing and zone == "-"):
            raise ApiError(
                "NOT_FOUND", f'Location "projects/{project}/locations/{zone}" not found.'
            )
        return f"projects/{PROJECT_ID}/locations/{zone}"

    def live(self, name: str | None = None) -> dict | None:
        """The node record if a node exists (and has `name`, when given)."""
        with self._lock:
            node = self._node
        if node is None or self.slice.state == SliceState.MISSING:
            return None
        return node if name is None or node["name"] == name else None

    def _found(self, project: str, zone: str, node_id: str) -> dict:
        name = f"{self.location(project, zone)}/nodes/{node_id}"
        node = self.live(name)
        if node is None:
            raise not_found(name)
        return node

    # -- nodes -------------------------------------------------------------------------------
    def node_json(self, node: dict) -> dict:
        view = self.slice.describe()
        state = SliceState(view["state"])
        if state == SliceState.MISSING:  # deleted since the caller looked it up
            state = SliceState.DELETING
        out = {
            **node["request"],
            "name": node["name"],
            "id": node["id"],
            "createTime": node["createTime"],
            "apiVersion": "V2",
            "state": str(state),
            "cidrBlock": f"127.0.{self.layout['subnet']}.0/24",
            "networkEndpoints": [
                {"ipAddress": address, "port": NODE_PORT} for address in self.layout["addresses"]
            ],
        }
        if view["health"]:
            out["health"] = view["health"]
        if view["detail"] and (state in TELL_DETAIL or view["health"] not in (None, "HEALTHY")):
            out["healthDescription"] = view["detail"]
        return out | self.faults.node_answer(node["id"])

    def list_nodes(self, project: str, zone: str) -> dict:
        self.location(project, zone, listing=True)
        node = self.live()
        here = node is not None and zone in ("-", _zone(node))
        return {"nodes": [self.node_json(node)]} if here else {}

    def get_node(self, project: str, zone: str, node_id: str) -> dict:
        return self.node_json(self._found(project, zone, node_id))

    def create_node(self, project: str, zone: str, node_id: str | None, body: dict) -> dict:
        parent = self.location(project, zone)
        check_node_id(node_id)
        request = node_request(body, self.accelerator, len(self.layout["addresses"]))
        name = f"{parent}/nodes/{node_id}"
        with self._lock:
            current = self.live()
            if current is not None:
                raise ApiError("ALREADY_EXISTS", f'Resource "{current["name"]}" already exists.')
            self.check_quota(holder(zone, request))  # refused at once, before any operation
            operation = self.operations.new(name, "create")
            if self.faults.take_stockout(zone):
                timer = threading.Timer(STOCKOUT_DELAY_S, self._stockout, [operation, zone])
                timer.daemon = True
                timer.start()
                return copy(operation)
            try:
                self.boot(name, node_id, request, lambda node: self._created(operation, node))
            except ApiError:
                self.operations.drop(operation)
                raise
            return copy(operation)

    def boot(self, name: str, node_id: str, request: dict, on_done, owner: str | None = None
             ) -> dict:  # fmt: skip
        """The node record and its slice's creation (nodes.create's, or the queued resource
        `owner`'s); `on_done(node)` once the slice is READY or failed. FAILED_PRECONDITION while
        the slice is still in use."""
        node = {
            "id": str(secrets.randbelow(8 * 10**18) + 10**18),
            "name": name,
            "createTime": now(),
            "request": request,
            "owner": owner,
        }
        zone = name.split("/")[3]
        with self._lock:
            self.slice.store.set_node(**_gce_node(node_id, zone, request))
            try:
                self.slice.create(request.get("metadata", {}), on_done=lambda: on_done(node),
                                  accelerator=request["acceleratorType"])  # fmt: skip
            except PodError as err:
                raise ApiError("FAILED_PRECONDITION", str(err)) from None
            self._node = node
            return node

    def remove(self, node: dict, on_done) -> None:
        """Delete `node`'s slice (a queued resource deleted with force); `on_done()` after."""

        def gone() -> None:
            with self._lock:
                if self._node is node:
                    self._node = None
            on_done()

        try:
            self.slice.delete(on_done=gone)
        except PodError as err:
            raise ApiError("FAILED_PRECONDITION", str(err)) from None

    def refuse_if_unavailable(self) -> None:
        if self.faults.take_unavailable():
            raise ApiError("UNAVAILABLE", "The service is currently unavailable.")

    def check_quota(self, new: Holder) -> None:
        """HTTP 429 naming the quota when `new` would go over it (localpod.gcp.tpu_quota), or when
        a refusal was injected for its zone (the limit named is the pod's, else 0)."""
        with self._lock:
            node = self.live()
            held = [] if node is None or node["owner"] else [holder(_zone(node), node["request"])]
            scope = self.faults.take_quota(new.zone)
            if scope is not None:
                raise self.quota.refusal(new, [(scope, self.quota.limit(scope))])
            self.quota.check(held + self.request_holders(), new)

    def delete_node(self, project: str, zone: str, node_id: str) -> dict:
        node = self._found(project, zone, node_id)
        with self._lock:
            operation = self.operations.new(node["name"], "delete")
        try:
            self.slice.delete(on_done=lambda: self._deleted(operation, node))
        except PodError as err:
            with self._lock:
                self.operations.drop(operation)
            raise ApiError("FAILED_PRECONDITION", str(err)) from None
        with self._lock:
            return copy(operation)

    def patch_node(
        self, project: str, zone: str, node_id: str, update_mask: str, body: dict
    ) -> dict:
        """nodes.patch: the fields `update_mask` names are replaced (a map such as `metadata` as
        a whole, as Google's field masks do); a new metadata reaches every worker's metadata
        server at once, as on a TPU VM, and the startup script is not run again."""
        node = self._found(project, zone, node_id)
        fields = [f.strip() for f in update_mask.split(",") if f.strip()]
        if not fields:
            raise ApiError("INVALID_ARGUMENT", "update_mask is required.")
        for name in fields:
            if name in NOT_HERE:
                raise ApiError("UNIMPLEMENTED", f"{name}: the local pod has no external IPs.")
            if name not in PATCHABLE:
                raise ApiError("INVALID_ARGUMENT", f"Invalid update_mask field: {name!r} "
                               f"(supported: {', '.join(PATCHABLE)}).")  # fmt: skip
        changes = {name: body.get(name) for name in fields}
        meta = changes.get("metadata")
        if meta is not None and not (
            isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())
        ):
            raise ApiError("INVALID_ARGUMENT", "metadata must map strings to strings.")
        with self._lock:
            operation = self.operations.new(node["name"], "update")
            for name, value in changes.items():
                if value in (None, {}, []):
                    node["request"].pop(name, None)
                else:
                    node["request"][name] = value
            if "metadata" in changes:
                self.slice.update_metadata(node["request"].get("metadata", {}))
            self.operations.finish(
                operation, {"response": {"@type": NODE_TYPE, **self.node_json(node)}}
            )
            return copy(operation)

    def guest_attributes(self, project: str, zone: str, node_id: str, body: dict) -> dict:
        self._found(project, zone, node_id)
        instances = self.slice.describe()["instances"]
        count = len(self.layout["addresses"])
        wanted = [str(w) for w in body.get("workerIds") or range(count)]
        if any(not w.isdigit() or int(w) >= count for w in wanted):
            raise ApiError("INVALID_ARGUMENT", f"workerIds {wanted} out of range 0..{count - 1}.")
        query = body.get("queryPath") or ""
        entries = []
        for worker in map(int, wanted):
            items = []
            if worker < len(instances):
                instance = instances[worker]
                items = [
                    {"namespace": "", "key": "hostname", "value": instance["hostname"]},
                    {"namespace": "hostkeys", "key": "ssh-ed25519", "value": instance["host_key"]},
                ]
            items = [
                i for i in items if f"{i['namespace']}/{i['key']}".lstrip("/").startswith(query)
            ]
            entries.append({"queryPath": query, "queryValue": {"items": items}})
        return {"guestAttributes": entries}

    def inject_stockout(self, count: int = 1, zone: str | None = None) -> int:
        """The next `count` creates (in `zone`; None: in any; "node": where the node is now)
        fail with RESOURCE_EXHAUSTED; returns how many are pending there."""
        if zone == "node":
            node = self.live()
            zone = _zone(node) if node else ZONES[0]
        return self.faults.inject_stockout(count, zone)

    def answer_node(self, state: str | None = None, health: str | None = None) -> dict:
        """The live node answers `state` and/or `health` until it is deleted (TpuFaults)."""
        node = self.live()
        if node is None:
            raise PodError("there is no node to answer for")
        return self.faults.answer_node(node["id"], state, health)

    # -- operations --------------------------------------------------------------------------
    def _created(self, operation: dict, node: dict) -> None:
        view = self.slice.describe()
        if view["state"] == SliceState.READY:
            self.operations.finish(
                operation, {"response": {"@type": NODE_TYPE, **self.node_json(node)}}
            )
        else:
            message = view["detail"] or f"node is {view['state']}"
            self.operations.finish(
                operation, {"error": {"code": RPC_CODE["INTERNAL"], "message": message}}
            )

    def _deleted(self, operation: dict, node: dict) -> None:
        with self._lock:
            if self._node is node:
                self._node = None
        self.operations.finish(operation, {"response": {"@type": EMPTY_TYPE}})

    def _stockout(self, operation: dict, zone: str) -> None:
        message = STOCKOUT.format(zone=zone, eid=secrets.token_hex(8))
        code = RPC_CODE["RESOURCE_EXHAUSTED"]
        self.operations.finish(operation, {"error": {"code": code, "message": message}})

    def get_operation(self, project: str, zone: str, operation_id: str) -> dict:
        return self.operations.get(f"{self.location(project, zone)}/operations/{operation_id}")


def _zone(node: dict) -> str:
    return node["name"].split("/")[3]
