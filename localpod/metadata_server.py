"""A GCE metadata server speaking the real protocol, one listener per worker address.

A worker is answered as itself by the local address its request arrived on (worker i reaches
`127.0.K.(i+1):PORT` through `GCE_METADATA_HOST`), so one port serves the whole slice. Only the
paths a TPU VM's software reads are served; everything else is a 404, as on GCE.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PREFIX = "/computeMetadata/v1/"
TOKEN = {"access_token": "local", "expires_in": 3600, "token_type": "Bearer"}
PROJECT_ID = "tpupod-local"
ZONE = "local-a"


class MetadataStore:
    """Per-worker attributes plus the slice-wide preempted flag (waitable, like GCE's)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._attributes: dict[int, dict[str, str]] = {}
        self._preempted = False
        self.hostnames: dict[int, str] = {}

    def set_attributes(self, attributes: dict[int, dict[str, str]], hostnames: dict[int, str]):
        with self._cond:
            self._attributes = {i: dict(a) for i, a in attributes.items()}
            self.hostnames = dict(hostnames)

    def attributes(self, index: int) -> dict[str, str]:
        with self._cond:
            return dict(self._attributes.get(index, {}))

    @property
    def preempted(self) -> bool:
        return self._preempted

    def set_preempted(self, value: bool) -> None:
        with self._cond:
            self._preempted = value
            self._cond.notify_all()

    def wait_preempted_change(self, last: bool, timeout: float) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._preempted != last, timeout=timeout)
            return self._preempted


class _Handler(BaseHTTPRequestHandler):
    server: _WorkerServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet by design
        pass

    def _send(self, code: int, body: str, content_type: str = "application/text") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.headers.get("Metadata-Flavor", "").lower() != "google":
            return self._send(403, "Missing Metadata-Flavor:Google header.\n", "text/html")
        if self.headers.get("X-Forwarded-For"):
            return self._send(403, "Request had an X-Forwarded-For header.\n", "text/html")
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path in ("/", "/computeMetadata/", PREFIX.rstrip("/"), PREFIX):
            return self._send(200, "instance/\nproject/\n")
        if not url.path.startswith(PREFIX):
            return self._send(404, "Not Found\n", "text/html")
        found = self.server.answer(url.path[len(PREFIX) :], query)
        if found is None:
            return self._send(404, "Not Found\n", "text/html")
        self._send(200, *found)


class _WorkerServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], index: int, store: MetadataStore):
        super().__init__(address, _Handler)
        self.index = index
        self.store = store

    def answer(self, path: str, query: dict[str, str]) -> tuple[str, str] | None:
        """(body, content type) for a path under /computeMetadata/v1/, None for 404."""
        attributes = self.store.attributes(self.index)
        hostname = self.store.hostnames.get(self.index, f"worker-{self.index}")
        recursive = query.get("recursive", "").lower() == "true" or query.get("alt") == "json"
        if path.rstrip("/") == "instance/attributes":
            if recursive:
                return json.dumps(attributes), "application/json"
            return "".join(f"{key}\n" for key in sorted(attributes)), "application/text"
        if path.startswith("instance/attributes/"):
            value = attributes.get(path[len("instance/attributes/") :])
            return None if value is None else (value, "application/text")
        if path == "instance/preempted":
            value = self.store.preempted
            if query.get("wait_for_change", "").lower() == "true":
                timeout = float(query.get("timeout_sec", "3600"))
                value = self.store.wait_preempted_change(value, timeout)
            return ("TRUE" if value else "FALSE"), "application/text"
        simple = {
            "instance/hostname": hostname,
            "instance/name": hostname,
            "instance/id": str(1000 + self.index),
            "instance/zone": f"projects/1234/zones/{ZONE}",
            "project/project-id": PROJECT_ID,
            "project/numeric-project-id": "1234",
            "instance/service-accounts/default/email": f"local@{PROJECT_ID}.iam.gserviceaccount.com",
            "instance/service-accounts/default/scopes": "https://www.googleapis.com/auth/cloud-platform",
        }
        if path in simple:
            return simple[path], "application/text"
        if path == "instance/service-accounts/default/token":
            return json.dumps(TOKEN), "application/json"
        if path.rstrip("/") == "instance/service-accounts":
            return "default/\n", "application/text"
        return None


class MetadataServer:
    """Listeners on each worker address, same port, served from daemon threads."""

    def __init__(self, addresses: list[str], port: int, store: MetadataStore) -> None:
        self.port = port
        self.store = store
        self._servers = [
            _WorkerServer((address, port), index, store) for index, address in enumerate(addresses)
        ]
        self._threads = [
            threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
            for s in self._servers
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
