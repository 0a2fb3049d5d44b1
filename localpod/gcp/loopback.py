"""The local cloud's JSON APIs on 127.0.0.1: one server shape and one handler base for all of them
(the Cloud TPU API, Secret Manager, OS Login), so answering, parsing and authorising live once.

`LoopbackServer(handler, gate)`: `url` is http://127.0.0.1:PORT, served from a daemon thread.
`JsonApiHandler`: quiet; `reply` writes JSON; `authorize` asks the server's `Gate` (localpod.gcp.authz)
and turns its refusal into the API's own google.rpc answer (401, 403 SERVICE_DISABLED, 403
IAM_PERMISSION_DENIED). A server without a gate (a unit test's) authorises nothing and refuses
nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from localpod.gcp import gcp_errors
from localpod.gcp.authz import Caller, Denied, Gate, Target
from localpod.gcp.gcp_errors import ApiError


def send_json(handler: BaseHTTPRequestHandler, code: int, payload: dict) -> None:
    """One JSON answer, as Google's front ends send it (the shape every stand-in shares)."""
    data = json.dumps(payload, indent=2).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json; charset=UTF-8")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class LoopbackServer(ThreadingHTTPServer):
    """`url` is http://127.0.0.1:PORT; start() serves in the background, stop() closes."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], gate: Gate | None = None) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.gate = gate
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class JsonApiHandler(BaseHTTPRequestHandler):
    server: LoopbackServer
    protocol_version = "HTTP/1.1"
    service = ""  # the API's service name (tpu.googleapis.com): its subclass sets it

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet by design
        pass

    def reply(self, code: int, payload: dict) -> None:
        send_json(self, code, payload)

    def reply_error(self, err: ApiError) -> None:
        self.reply(err.http_status, err.body())

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def caller(self) -> Caller:
        gate = self.server.gate
        if gate is None:
            return Caller(None, "missing")
        return gate.caller(self.headers.get("Authorization"))

    def authorize(self, method: str, rpc: str, targets: Iterable[Target]) -> Caller:
        """The caller, once the gate lets it call `method` (rpc: Google's full method name, as
        a 401 names it) on `targets`; ApiError as Google answers otherwise."""
        gate = self.server.gate
        if gate is None:
            return Caller(None, "missing")
        caller = self.caller()
        try:
            gate.check(caller, self.service, method, targets)
        except Denied as denied:
            raise refusal(denied, rpc, gate.policy.project) from None
        return caller


def refusal(denied: Denied, rpc: str, project: str) -> ApiError:
    """A gate's refusal as a google.rpc answer."""
    if denied.kind == "unauthenticated":
        return gcp_errors.unauthenticated(denied.caller.problem, denied.service, rpc)
    if denied.kind == "disabled":
        return gcp_errors.service_disabled(denied.service, project)
    target = denied.target
    return gcp_errors.permission_denied(denied.service, target.permission, target.name)
