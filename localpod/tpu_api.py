"""The pod's Cloud TPU v2 REST API on loopback: Google's paths, JSON and error shapes.

Google's own clients (google-cloud-tpu over REST, gcloud with api_endpoint_overrides/tpu) work
against it unchanged; the resources and their semantics are `localpod.tpu_nodes.TpuService`
(nodes, operations) and `localpod.tpu_queued.QueuedResources`.
"""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from localpod.loopback import LoopbackServer
from localpod.tpu_nodes import TpuService
from localpod.tpu_queued import QueuedResources
from localpod.tpu_requests import HTTP_STATUS, ApiError

_LOCATION = r"/v2/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
_QUEUED = _LOCATION + r"/queuedResources/(?P<queued_resource_id>[^/:]+)"
_ROUTES: list[tuple[str, re.Pattern, str]] = [
    ("GET", re.compile(_LOCATION + r"/nodes"), "list_nodes"),
    ("POST", re.compile(_LOCATION + r"/nodes"), "create_node"),
    ("GET", re.compile(_LOCATION + r"/nodes/(?P<node_id>[^/:]+)"), "get_node"),
    ("DELETE", re.compile(_LOCATION + r"/nodes/(?P<node_id>[^/:]+)"), "delete_node"),
    ("PATCH", re.compile(_LOCATION + r"/nodes/(?P<node_id>[^/:]+)"), "patch_node"),
    (
        "POST",
        re.compile(_LOCATION + r"/nodes/(?P<node_id>[^/:]+):getGuestAttributes"),
        "guest_attributes",
    ),
    ("GET", re.compile(_LOCATION + r"/operations/(?P<operation_id>[^/]+)"), "get_operation"),
    ("GET", re.compile(_LOCATION + r"/queuedResources"), "list_queued_resources"),
    ("POST", re.compile(_LOCATION + r"/queuedResources"), "create_queued_resource"),
    ("GET", re.compile(_QUEUED), "get_queued_resource"),
    ("DELETE", re.compile(_QUEUED), "delete_queued_resource"),
    ("POST", re.compile(_QUEUED + ":reset"), "reset_queued_resource"),
]


class _Handler(BaseHTTPRequestHandler):
    server: TpuApiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet by design
        pass

    def _reply(self, code: int, payload: dict) -> None:
        data = json.dumps(payload, indent=2).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        service = self.server.service
        try:
            service.refuse_if_unavailable()
            action, match = _route(self.command, url.path)
            args = match.groupdict()
            if action == "create_node":
                args |= {"node_id": query.get("nodeId"), "body": _json(raw)}
            elif action == "patch_node":
                args |= {"update_mask": query.get("updateMask", ""), "body": _json(raw)}
            elif action == "guest_attributes":
                args["body"] = _json(raw) or {}
            elif action == "create_queued_resource":
                args |= {"queued_resource_id": query.get("queuedResourceId"), "body": _json(raw)}
            elif action == "delete_queued_resource":
                args["force"] = query.get("force", "").lower() == "true"
            owner = self.server.queued if "queued_resource" in action else service
            result = getattr(owner, action)(**args)
        except ApiError as err:
            return self._reply(HTTP_STATUS[err.status], err.body())
        self._reply(200, result)

    do_GET = do_POST = do_DELETE = do_PATCH = _handle  # noqa: N815 - http.server's naming


def _route(method: str, path: str) -> tuple[str, re.Match]:
    for verb, pattern, action in _ROUTES:
        if verb == method and (match := pattern.fullmatch(path)):
            return action, match
    raise ApiError("NOT_FOUND", f"No method {method} {path}.")


def _json(raw: bytes) -> dict:
    try:
        return json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. {err}") from None


class TpuApiServer(LoopbackServer):
    """`url` is the API root a client's api_endpoint takes (ending in "/")."""

    def __init__(self, service: TpuService) -> None:
        super().__init__(_Handler)
        self.service = service
        self.queued = QueuedResources(service)
        self.url += "/"
