"""The one provider: the Cloud TPU v2 API through Google's client (google-cloud-tpu, REST).

On GCP it uses Application Default Credentials and Google's endpoint; for the local pod the
pod's own copy of the API on loopback with anonymous credentials. Describe reads the live node
(state, health, networkEndpoints) and its guest attributes (each worker's instance name and SSH
host key, as `gcloud compute tpus tpu-vm ssh` does); recreate is delete + create from the node
spec the Pulumi program exported, under the same name. Every call is short: long-running
operations are returned by name and polled by the caller (`ops.watch`), so recovery survives a
restart of `watch`.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass

from infra import metadata
from ops.provider import ProviderError, SliceInfo, SliceState, Worker
from ops.target import Target

warnings.filterwarnings("ignore", message="You are using a Python version", category=FutureWarning)

from google.api_core import exceptions as gexc  # noqa: E402
from google.cloud import tpu_v2  # noqa: E402

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
# The TPU API's ways of saying "no capacity in this zone right now" (besides code 8).
STOCKOUT_MARKERS = ("no more capacity", "stockout", "insufficient capacity", "resource_exhausted")
RESOURCE_EXHAUSTED = 8
NOT_FOUND = 5
CALL_TIMEOUT = 30.0
RETRIED_400S = {"FAILED_PRECONDITION", "OUT_OF_RANGE"}  # the state, not the request, is wrong
PERMISSION_HINT = (
    "the caller lacks TPU API rights on {name}: grant roles/tpu.admin (or tpu.nodes.get/create/"
    "delete, tpu.operations.get) and roles/iam.serviceAccountUser on the worker service account"
)


@dataclass(frozen=True)
class OperationStatus:
    name: str
    done: bool
    error_code: int = 0
    error_message: str = ""

    @property
    def stockout(self) -> bool:
        return self.done and is_stockout(self.error_code, self.error_message)


class Stockout(ProviderError):
    """The zone has no capacity for the node now: retry later, it is nobody's failure."""


class Refused(ProviderError):
    """A request the TPU API will refuse however often it is sent: permission denied (403) or an
    invalid request (400). Recovery stops with the line that says what to fix."""


class QuotaExceeded(ProviderError):
    """The project's quota for this TPU is spent: a create is retried with backoff, but only
    more quota (or another zone) ends it, so the line names the quota."""


QUOTA_HINT = "raise it under IAM & Admin > Quotas (filter: TPU) or move the stack to another zone"


def refused(err: gexc.TooManyRequests, name: str) -> ProviderError:
    """A create refused with 429 / RESOURCE_EXHAUSTED. Over REST google-api-core raises
    TooManyRequests (not its subclass ResourceExhausted), for quota and capacity alike: only the
    body tells them apart (the quota named in the message or an ErrorInfo's metadata)."""
    limit = ""
    try:
        details = err.response.json()["error"].get("details", [])
        for d in details:
            meta = d.get("metadata") or {}
            limit = limit or meta.get("quota_limit") or meta.get("quota_metric") or ""
    except (AttributeError, KeyError, TypeError, ValueError):
        pass
    message = _line(err)
    if limit or "quota" in message.lower():
        named = f" ({limit})" if limit else ""
        return QuotaExceeded(f"quota exceeded for {name}{named}: {message}; {QUOTA_HINT}")
    return Stockout(f"no capacity for {name}: {message}")


def is_stockout(code: int, message: str) -> bool:
    return code == RESOURCE_EXHAUSTED or any(m in message.lower() for m in STOCKOUT_MARKERS)


class TpuProvider:
    """One node of one target; `client` may be given (tests), else built on first use."""

    def __init__(self, target: Target, client: tpu_v2.TpuClient | None = None):
        self.target = target
        self.name = target.stack
        self._client = client
        self._workers_cache: tuple[tuple, list[Worker]] | None = None

    @property
    def client(self) -> tpu_v2.TpuClient:
        if self._client is None:
            self._client = make_client(self.target)
        return self._client

    def node_from_spec(self) -> tpu_v2.Node:
        try:
            return tpu_v2.Node.from_json(json.dumps(self.target.spec["node"]))
        except (ValueError, TypeError) as err:
            raise ProviderError(f"node spec of {self.name}: not a tpu_v2.Node ({err})") from None

    # -- reads -----------------------------------------------------------------------------------
    def describe(self) -> SliceInfo:
        try:
            node = self._call("get", self.client.get_node, name=self.target.node_name)
        except gexc.NotFound:
            return SliceInfo(SliceState.MISSING, detail="node not found")
        state = SliceState.parse(tpu_v2.Node.State(node.state).name)
        health = tpu_v2.Node.Health(node.health).name if node.health else None
        workers = self.workers(node) if state is SliceState.READY else []
        spot = bool(node.scheduling_config.spot or node.scheduling_config.preemptible)
        return SliceInfo(state, health, workers, node.health_description or state.value,
                         dict(node.metadata), spot)  # fmt: skip

    def refresh_spec(self) -> list[str]:
        """The live node's metadata into the spec a recreate uses, so it never goes back to an
        older bundle after `pulumi up` (or `tpupod local rollout`) patched the node; returns
        the keys that changed. One nodes.get; a node already gone keeps the spec as it is."""
        try:
            node = self._call("get", self.client.get_node, name=self.target.node_name)
        except gexc.NotFound:
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
        proxy = ssh.iap_command.format(instance=instance, zone=t.zone, project=t.project)
        return Worker(index, instance, 22, proxy_command=proxy, **common)

    def operation(self, name: str) -> OperationStatus:
        """An operation the API no longer knows counts as done: the node's state tells the rest."""
        try:
            op = self._call("operations.get", self.client.get_operation, request={"name": name})
        except gexc.NotFound:
            return OperationStatus(name, True)
        return OperationStatus(name, bool(op.done), op.error.code, op.error.message)

    # -- writes: each returns its long-running operation's name at once -------------------------
    def start_delete(self) -> str | None:
        """None when there is no node to delete."""
        try:
            op = self._call("delete", self.client.delete_node, name=self.target.node_name)
        except gexc.NotFound:
            return None
        return op.operation.name

    def start_create(self, attempt: int | None = None) -> str | None:
        """None when the node already exists (a create issued before a restart of `watch`);
        raises Stockout when the API refuses at once for capacity. `attempt`: the job's attempt
        the new node boots (metadata `tpupod-attempt`, read by its startup script)."""
        spec = self.target.spec
        node = self.node_from_spec()
        if attempt is not None:
            node.metadata[metadata.ATTEMPT] = str(attempt)
        try:
            op = self._call(
                "create", self.client.create_node,
                parent=spec["parent"], node_id=spec["node_id"], node=node,
            )  # fmt: skip
        except gexc.TooManyRequests as err:  # ResourceExhausted over gRPC is one of these
            raise refused(err, self.name) from None
        except gexc.AlreadyExists:
            return None
        return op.operation.name

    def recreate(self, timeout: float = 600.0, poll: float = 0.5) -> OperationStatus:
        """Blocking delete + create (for the CLI and tests; `watch` steps through it instead)."""
        end = time.time() + timeout
        delete = self.start_delete()
        while delete and not self.operation(delete).done:
            if time.time() > end:
                raise ProviderError(f"delete of {self.name} still running after {timeout:.0f}s")
            time.sleep(poll)
        create = self.start_create()
        if create is None:
            return OperationStatus("", True)
        while not (status := self.operation(create)).done:
            if time.time() > end:
                raise ProviderError(f"create of {self.name} still running after {timeout:.0f}s")
            time.sleep(poll)
        return status

    def _call(self, what: str, method, **kwargs):
        try:
            return method(**kwargs, timeout=CALL_TIMEOUT)
        except (gexc.NotFound, gexc.TooManyRequests, gexc.AlreadyExists):
            raise
        except gexc.Conflict as err:
            if already_exists(err):  # over REST, ALREADY_EXISTS arrives as a plain 409 Conflict
                raise gexc.AlreadyExists(err.message) from None
            raise ProviderError(f"TPU API {what} {self.target.node_name}: {_line(err)}") from None
        except (gexc.Forbidden, gexc.BadRequest) as err:
            if status_of(err) in RETRIED_400S:  # a 400 a later try can pass (a node busy)
                raise ProviderError(
                    f"TPU API {what} {self.target.node_name}: {_line(err)}"
                ) from None
            if isinstance(err, gexc.Forbidden):  # over REST a 403 is Forbidden, not its subclass
                raise Refused(PERMISSION_HINT.format(name=self.target.node_name)) from None
            raise Refused(
                f"TPU API {what} {self.target.node_name} refused the request: "
                f"{_line(err)}; fix the stack's node spec and deploy again"
            ) from None
        except gexc.GoogleAPIError as err:
            raise ProviderError(f"TPU API {what} {self.target.node_name}: {_line(err)}") from None
        except OSError as err:  # requests' ConnectionError is an OSError
            where = self.target.api_endpoint or "tpu.googleapis.com"
            raise ProviderError(f"TPU API at {where} unreachable: {_line(err)}") from None


def status_of(err: gexc.GoogleAPICallError) -> str | None:
    """The error's canonical status: gRPC names it in the class, REST only in the body (over
    REST google-api-core raises the HTTP code's base class: Conflict for ALREADY_EXISTS,
    BadRequest for FAILED_PRECONDITION, Forbidden for PERMISSION_DENIED)."""
    try:
        return err.response.json()["error"]["status"]
    except (AttributeError, KeyError, TypeError, ValueError):
        code = getattr(err, "grpc_status_code", None)
        return code.name if code is not None else None


def already_exists(err: gexc.Conflict) -> bool:
    """A 409 that means ALREADY_EXISTS (not ABORTED)."""
    if isinstance(err, gexc.AlreadyExists):
        return True
    status = status_of(err)
    return status == "ALREADY_EXISTS" if status else "already exists" in str(err.message).lower()


def make_client(target: Target) -> tpu_v2.TpuClient:
    if target.anonymous:
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    else:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError

        try:
            credentials, _ = google.auth.default(scopes=SCOPES)
        except DefaultCredentialsError:
            raise ProviderError(
                "no Google credentials: run `gcloud auth application-default login` "
                "(or set GOOGLE_APPLICATION_CREDENTIALS to a service account key)"
            ) from None
    options = {"api_endpoint": target.api_endpoint} if target.api_endpoint else None
    return tpu_v2.TpuClient(transport="rest", credentials=credentials, client_options=options)


def _line(err: BaseException) -> str:
    text = getattr(err, "message", None) or str(err) or type(err).__name__
    return " ".join(str(text).split())[:300]
