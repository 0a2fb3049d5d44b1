"""The pod's Cloud TPU v2 REST API on loopback: Google's paths, JSON and error shapes.

Google's own clients (google-cloud-tpu over REST, gcloud with api_endpoint_overrides/tpu) work
against it unchanged; the resources and their semantics are `localpod.gcp.tpu_nodes.TpuService`
(nodes, operations) and `localpod.gcp.tpu_queued.QueuedResources`. Every call is authorised first
(localpod.gcp.authz, through the handler base): the catalog's permission for the route's REST method,
on the resource Google checks it on, before anything about the resource is told.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from localpod.gcp.authz import Target
from localpod.gcp.loopback import JsonApiHandler, LoopbackServer
from localpod.gcp.tpu_nodes import TpuService
from localpod.gcp.tpu_queued import QueuedResources
from localpod.gcp.tpu_requests import ApiError

SERVICE = "tpu.googleapis.com"
_LOCATION = r"/v2/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
_NODE = _LOCATION + r"/nodes/(?P<node_id>[^/:]+)"
_QUEUED = _LOCATION + r"/queuedResources/(?P<queued_resource_id>[^/:]+)"
_OPERATION = _LOCATION + r"/operations/(?P<operation_id>[^/]+)"


@dataclass(frozen=True)
class Route:
    verb: str
    pattern: re.Pattern
    action: str  # TpuService's / QueuedResources' method
    method: str  # the REST method id, as the IAM catalog names it
    rpc: str  # the RPC's full name (a 401 names it)
    on: str  # what the permission is checked on: "location" (a create, a list) or "resource"


def _route(verb: str, pattern: str, action: str, method: str, rpc: str, on: str) -> Route:
    return Route(verb, re.compile(pattern), action, f"tpu.projects.locations.{method}",
                 f"google.cloud.tpu.v2.Tpu.{rpc}", on)  # fmt: skip


ROUTES = (
    _route("GET", _LOCATION + r"/nodes", "list_nodes", "nodes.list", "ListNodes", "location"),
    _route("POST", _LOCATION + r"/nodes", "create_node", "nodes.create", "CreateNode", "location"),
    _route("GET", _NODE, "get_node", "nodes.get", "GetNode", "resource"),
    _route("DELETE", _NODE, "delete_node", "nodes.delete", "DeleteNode", "resource"),
    _route("PATCH", _NODE, "patch_node", "nodes.patch", "UpdateNode", "resource"),
    _route(
        "POST",
        _NODE + r":getGuestAttributes",
        "guest_attributes",
        "nodes.getGuestAttributes",
        "GetGuestAttributes",
        "resource",
    ),  # fmt: skip
    Route(
        "GET",
        re.compile(_OPERATION),
        "get_operation",
        "tpu.projects.locations.operations.get",
        "google.longrunning.Operations.GetOperation",
        "resource",
    ),  # fmt: skip
    _route(
        "GET",
        _LOCATION + r"/queuedResources",
        "list_queued_resources",
        "queuedResources.list",
        "ListQueuedResources",
        "location",
    ),  # fmt: skip
    _route(
        "POST",
        _LOCATION + r"/queuedResources",
        "create_queued_resource",
        "queuedResources.create",
        "CreateQueuedResource",
        "location",
    ),  # fmt: skip
    _route(
        "GET",
        _QUEUED,
        "get_queued_resource",
        "queuedResources.get",
        "GetQueuedResource",
        "resource",
    ),  # fmt: skip
    _route(
        "DELETE",
        _QUEUED,
        "delete_queued_resource",
        "queuedResources.delete",
        "DeleteQueuedResource",
        "resource",
    ),  # fmt: skip
    _route(
        "POST",
        _QUEUED + ":reset",
        "reset_queued_resource",
        "queuedResources.reset",
        "ResetQueuedResource",
        "resource",
    ),  # fmt: skip
)
RESOURCE_TYPES = {"nodes": "Node", "queuedResources": "QueuedResource", "operations": "Operation"}


class _Handler(JsonApiHandler):
    server: TpuApiServer
    service = SERVICE

    def _handle(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        raw = self.read_body()
        service = self.server.service
        try:
            service.refuse_if_unavailable()
            route, match = _find(self.command, url.path)
            args = match.groupdict()
            body = _json(raw) if route.verb in ("POST", "PATCH") else {}
            self.authorize(route.method, route.rpc, self._targets(route, url.path, body))
            if route.action == "create_node":
                args |= {"node_id": query.get("nodeId"), "body": body}
            elif route.action == "patch_node":
                args |= {"update_mask": query.get("updateMask", ""), "body": body}
            elif route.action == "guest_attributes":
                args["body"] = body or {}
            elif route.action == "create_queued_resource":
                args |= {"queued_resource_id": query.get("queuedResourceId"), "body": body}
            elif route.action == "delete_queued_resource":
                args["force"] = query.get("force", "").lower() == "true"
            owner = self.server.queued if "queued_resource" in route.action else service
            result = getattr(owner, route.action)(**args)
        except ApiError as err:
            return self.reply_error(err)
        self.reply(200, result)

    def _targets(self, route: Route, path: str, body: dict) -> list[Target]:
        """The route's permissions, each on what Google checks it on: the location for a create
        or a list, else the resource; actAs on the account a new node would run as."""
        gate = self.server.gate
        if gate is None:
            return []
        name = path.removeprefix("/v2/").split(":", 1)[0]
        if route.on == "location":
            name = "/".join(name.split("/")[:4])
            kind = "Location"
        else:
            kind = RESOURCE_TYPES.get(name.split("/")[4], "Node")
        account = _service_account(route.action, body)
        where = {}
        if account:
            project = name.split("/")[1]
            where["iam.serviceAccounts.actAs"] = (f"projects/{project}/serviceAccounts/{account}",
                                                  "iam.googleapis.com/ServiceAccount")  # fmt: skip
        cases = ("service_account",) if account else ()
        return gate.targets(route.method, name, f"{SERVICE}/{kind}", cases, where)

    do_GET = do_POST = do_DELETE = do_PATCH = _handle  # noqa: N815 - http.server's naming


def _service_account(action: str, body: dict) -> str | None:
    """The account a create or patch would have the node run as (the body's serviceAccount)."""
    if not isinstance(body, dict):
        return None
    node = body
    if action == "create_queued_resource":
        specs = ((body.get("tpu") or {}).get("nodeSpec") or [{}]) if body else [{}]
        node = (specs[0] if specs and isinstance(specs[0], dict) else {}).get("node") or {}
    account = node.get("serviceAccount") or node.get("service_account") or {}
    email = account.get("email") if isinstance(account, dict) else None
    return email if isinstance(email, str) and email else None


def _find(method: str, path: str) -> tuple[Route, re.Match]:
    for route in ROUTES:
        if route.verb == method and (match := route.pattern.fullmatch(path)):
            return route, match
    raise ApiError("NOT_FOUND", f"No method {method} {path}.")


def _json(raw: bytes) -> dict:
    try:
        return json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. {err}") from None


class TpuApiServer(LoopbackServer):
    """`url` is the API root a client's api_endpoint takes (ending in "/")."""

    def __init__(self, service: TpuService, gate=None) -> None:
        super().__init__(_Handler, gate)
        self.service = service
        self.queued = QueuedResources(service)
        self.url += "/"
