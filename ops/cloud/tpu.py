"""The TPU API's provider: the Cloud TPU v2 API through Google's client (google-cloud-tpu, REST).

On GCP it uses Application Default Credentials and Google's endpoint; for the local pod the
pod's own copy of the API on loopback with the operator's token (ops.cloud.credentials). Describe reads the live node
(state, health, networkEndpoints) and its guest attributes (each worker's instance name and SSH
host key, as `gcloud compute tpus tpu-vm ssh` does); recreate is delete + create from the node
spec the Pulumi program exported, under the same name. Every call is short: long-running
operations are returned by name and polled by the caller (`ops.watch`), so recovery survives a
restart of `watch`.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

from google.api_core import exceptions as gexc
from google.cloud import tpu_v2

from contract import metadata
from ops.cloud import queued
from ops.cloud.credentials import credentials
from ops.cloud.slice import ProviderError, SliceInfo, SliceState, Worker, ZoneCursor
from ops.cloud.target import Target
from ops.cloud.tpu_errors import is_stockout, judged, refused
from ops.cloud.tpu_fields import enum_name, symptoms, unnamed

CALL_TIMEOUT = 30.0


@dataclass(frozen=True)
class OperationStatus:
    name: str
    done: bool
    error_code: int = 0
    error_message: str = ""
    refusal: str = ""  # a create refused after it began: stockout, quota or region-quota

    @property
    def stockout(self) -> bool:
        return self.done and is_stockout(self.error_code, self.error_message)


class TpuProvider(ZoneCursor):
    """One node of one target; `client` may be given (tests), else built on first use.

    The node lives in one zone of the target's `tpupod:zones` at a time (`zone`); recovery moves
    it to the next one on a stockout or a quota refusal (`move_to`). With `via: queued` a create
    files a queued resource for the node and a delete takes request and node together."""

    def __init__(self, target: Target, client: tpu_v2.TpuClient | None = None):
        self.target = target
        self.name = target.stack
        self.capacity = target.capacity
        self.zones: list[str] = self.capacity["zones"]
        self.zone = target.zone
        self.queued = self.capacity["via"] == "queued"
        self._client = client
        self._workers_cache: tuple[tuple, list[Worker]] | None = None

    @property
    def client(self) -> tpu_v2.TpuClient:
        if self._client is None:
            self._client = make_client(self.target)
        return self._client

    @property
    def parent(self) -> str:
        return f"projects/{self.target.project}/locations/{self.zone}"

    @property
    def node_name(self) -> str:
        return f"{self.parent}/nodes/{self.target.node}"

    @property
    def request_name(self) -> str:
        """The queued resource that asks for the node here: it has the node's id."""
        return self.request_in(self.zone)

    def request_in(self, zone: str) -> str:
        """The queued resource that asks for the node in `zone` (one of tpupod:zones)."""
        return f"projects/{self.target.project}/locations/{zone}/queuedResources/{self.target.node}"

    def node_from_spec(self) -> tpu_v2.Node:
        try:
            return tpu_v2.Node.from_json(json.dumps(self.target.spec["node"]))
        except (ValueError, TypeError) as err:
            raise ProviderError(f"node spec of {self.name}: not a tpu_v2.Node ({err})") from None

    # -- reads -----------------------------------------------------------------------------------
    def describe(self) -> SliceInfo:
        node = self._node()
        if node is None and len(self.zones) > 1:
            node = self._locate()
        if node is None:
            return SliceInfo(SliceState.MISSING, detail="node not found", zone=self.zone)
        name = enum_name(tpu_v2.Node.State, node.state)
        state = SliceState.parse(name) if name else SliceState.UNRECOGNIZED
        health = None
        if node.health:  # HEALTH_UNSPECIFIED is none; a newer value keeps its number
            health = enum_name(tpu_v2.Node.Health, node.health) or f"HEALTH_{int(node.health)}"
        workers = self.workers(node) if state is SliceState.READY else []
        spot = bool(node.scheduling_config.spot or node.scheduling_config.preemptible)
        said = unnamed("state", node.state) if state is SliceState.UNRECOGNIZED else state.value
        detail = "; ".join([node.health_description or said, *symptoms(node)])
        return SliceInfo(state, health, workers, detail, dict(node.metadata), spot, self.zone)

    def _node(self) -> tpu_v2.Node | None:
        try:
            return self._call("get", self.client.get_node, name=self.node_name)
        except gexc.NotFound:
            return None

    def _locate(self) -> tpu_v2.Node | None:
        """The node in another of tpupod:zones (a watch restarted after a move; `tpupod
        status`): there it is from now on."""
        here = self.zone
        try:
            for zone in self.zones:
                if zone == here:
                    continue
                self.zone = zone
                if (node := self._node()) is not None:
                    here = zone
                    return node
            return None
        finally:
            self.zone = here

    def refresh_spec(self) -> list[str]:
        """The live node's metadata into the spec a recreate uses, so it never goes back to an
        older bundle after `pulumi up` (or `tpupod local rollout`) patched the node; returns
        the keys that changed. One nodes.get; a node already gone keeps the spec as it is."""
        node = self._node()
        if node is None:
            return []
        live = {k: v for k, v in node.metadata.items() if k != metadata.ATTEMPT}
        spec_node = self.target.spec.setdefault("node", {})
        kept = {k: v for k, v in (spec_node.get("metadata") or {}).items() if k != metadata.ATTEMPT}
        changed = sorted(k for k in live.keys() | kept.keys() if live.get(k) != kept.get(k))
        if changed and live:
            spec_node["metadata"] = live
        return changed

    def workers(self, node: tpu_v2.Node) -> list[Worker]:
        """Worker i: networkEndpoints[i] and guestAttributes[i] of the live node."""
        ips = tuple(e.ip_address for e in node.network_endpoints)
        key = (node.id, ips)
        if self._workers_cache and self._workers_cache[0] == key:
            return self._workers_cache[1]
        try:
            response = self._call(
                "getGuestAttributes", self.client.get_guest_attributes, request={"name": node.name}
            )
        except gexc.NotFound:
            return []
        attrs = [
            {item.key: item.value for item in ga.query_value.items}
            for ga in response.guest_attributes
        ]
        workers = [
            self._worker(i, ip, attrs[i] if i < len(attrs) else {}) for i, ip in enumerate(ips)
        ]
        if all(w.instance and w.host_key for w in workers):
            self._workers_cache = (key, workers)  # a new VM has a new id: never stale
        return workers

    def _worker(self, index: int, ip: str, attrs: dict) -> Worker:
        t, ssh = self.target, self.target.ssh
        instance, host_key = attrs.get("hostname"), attrs.get("ssh-ed25519")
        common = dict(user=ssh.user, key_filename=ssh.key_file, instance=instance,
                      host_key=host_key, internal_ip=ip)  # fmt: skip
        if ssh.via == "internal" or not instance:
            return Worker(index, ip, ssh.ports.get(ip, 22), **common)
        proxy = ssh.iap_command.format(instance=instance, zone=self.zone, project=t.project)
        return Worker(index, instance, 22, proxy_command=proxy, **common)

    def operation(self, name: str) -> OperationStatus:
        """An operation the API no longer knows counts as done: the node's state tells the rest."""
        try:
            op = self._call("operations.get", self.client.get_operation, request={"name": name})
        except gexc.NotFound:
            return OperationStatus(name, True)
        return OperationStatus(name, bool(op.done), op.error.code, op.error.message)

    def request_status(self, zone: str | None = None) -> queued.QueuedStatus:
        """The slice's queued resource in `zone` (default: this one); MISSING when none."""
        try:
            request = self._call("queuedResources.get", self.client.get_queued_resource,
                                 name=self.request_in(zone or self.zone))  # fmt: skip
        except gexc.NotFound:
            return queued.QueuedStatus(queued.MISSING)
        return queued.status_of(request)

    # -- writes: each returns its long-running operation's name at once -------------------------
    def start_delete(self) -> str | None:
        """None when there is nothing to delete. Queued: the request with its node (force), or
        the node alone where no request asked for it (the one `pulumi up` created)."""
        if self.queued:
            try:
                op = self._call("queuedResources.delete", self.client.delete_queued_resource,
                                request={"name": self.request_name, "force": True})  # fmt: skip
                return op.operation.name
            except gexc.NotFound:
                pass
        try:
            op = self._call("delete", self.client.delete_node, name=self.node_name)
        except gexc.NotFound:
            return None
        return op.operation.name

    def abandon_request(self, zone: str | None = None) -> bool:
        """Withdraw the request in `zone` (default: this one): still waiting in the zone's
        queue, or dead (FAILED, SUSPENDED); its delete is not waited for. True once none is
        left asking there."""
        with contextlib.suppress(gexc.NotFound):
            name = self.request_in(zone or self.zone)
            self._call("queuedResources.delete", self.client.delete_queued_resource,
                       request={"name": name, "force": True})  # fmt: skip
        return True

    def start_create(self, attempt: int | None = None) -> str | None:
        """None when the node (or its request) already exists (a create issued before a restart
        of `watch`); raises Stockout or QuotaExceeded when the API refuses at once. `attempt`:
        the job's attempt the new node boots (metadata `tpupod-attempt`, read by its startup
        script)."""
        node = self.node_from_spec()
        if attempt is not None:
            node.metadata[metadata.ATTEMPT] = str(attempt)
        node_id = self.target.spec["node_id"]
        try:
            if self.queued:
                request = queued.request_for(node, self.parent, node_id, self.capacity)
                op = self._call("queuedResources.create", self.client.create_queued_resource,
                                parent=self.parent, queued_resource_id=node_id,
                                queued_resource=request)  # fmt: skip
            else:
                op = self._call("create", self.client.create_node,
                                parent=self.parent, node_id=node_id, node=node)  # fmt: skip
        except gexc.TooManyRequests as err:  # ResourceExhausted over gRPC is one of these
            raise refused(err, f"{self.name} in {self.zone}") from None
        except gexc.AlreadyExists:
            return None
        except gexc.NotFound as err:  # e.g. a reservation the zone does not have
            raise ProviderError(f"create of {self.name} in {self.zone}: {err.message}") from None
        return op.operation.name

    def recreate(self, timeout: float = 600.0, poll: float = 0.5) -> OperationStatus:
        """Blocking delete + create (for the CLI and tests; `watch` steps through it instead)."""
        end = time.time() + timeout

        def wait(name: str | None, what: str) -> OperationStatus:
            while name and not (status := self.operation(name)).done:
                if time.time() > end:
                    raise ProviderError(f"{what} of {self.name} still running after {timeout:.0f}s")
                time.sleep(poll)
            return status if name else OperationStatus("", True)

        wait(self.start_delete(), "delete")
        status = wait(self.start_create(), "create")
        while self.queued and not status.error_code:
            state = self.request_status().state
            if state == queued.FILLED or state in queued.DEAD:
                break
            if time.time() > end:
                raise ProviderError(f"queued resource of {self.name} still {state}")
            time.sleep(poll)
        return status

    def owned(self) -> list:
        """Every node and queued resource labelled with the stack, in each of tpupod:zones: what
        `pulumi destroy --run-program` deletes (infra.cleanup; CleanupError when unreadable)."""
        from infra import cleanup

        return cleanup.list_owned(self.client, self.target.project, self.zones, self.target.stack)

    def _call(self, what: str, method, **kwargs):
        try:
            return method(**kwargs, timeout=CALL_TIMEOUT)
        except Exception as err:  # judged by its body: ops.cloud.tpu_errors
            raise judged(err, what, self.node_name, self.target.api_endpoint) from None


def make_client(target: Target) -> tpu_v2.TpuClient:
    creds = credentials(target.token_file)
    options = {"api_endpoint": target.api_endpoint} if target.api_endpoint else None
    return tpu_v2.TpuClient(transport="rest", credentials=creds, client_options=options)
