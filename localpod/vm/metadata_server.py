"""A GCE metadata server speaking the real protocol, one listener per worker address.

A worker is answered as itself by the local address its request arrived on (worker i reaches
`127.0.K.(i+1):PORT` through `GCE_METADATA_HOST`), so one port serves the whole slice. Each worker
sees one tree (instance/, project/, universe/) built from the store; the protocol is GCE's:
directories list their entries (`recursive=true` gives JSON), `alt=json` quotes a value as JSON,
every answer carries an `ETag`, `wait_for_change=true` (with `last_etag`, `timeout_sec`) blocks
until the answer changes, other methods get 405 and unknown paths 404. Only the paths a TPU VM's
software reads (google-auth, JAX, the startup script) are served.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from localpod.gcp import tokens

PREFIX = "/computeMetadata/v1/"
TOKEN_LIFETIME_S = 3599
PROJECT_ID = "tpupod-local"
PROJECT_NUMBER = "1234"
ZONE = "local-a"
ZONES = (ZONE, "local-b")  # the pod's region "local": its one slice may be created in either
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
MAX_WAIT_S = 3600.0
# Recursive JSON spells GCE's own names in camelCase; the entries of these keep their names.
_CAMEL_EXEMPT = ("attributes", "service-accounts")


@dataclass
class Node:
    """What GCE knows about the node the workers belong to (set at every create)."""

    node_id: str = "local"
    project: str = PROJECT_ID
    project_number: str = PROJECT_NUMBER
    zone: str = ZONE
    runtime_version: str = ""
    preemptible: bool = False
    service_account: str = f"local@{PROJECT_ID}.iam.gserviceaccount.com"
    scopes: list[str] = field(default_factory=lambda: [CLOUD_PLATFORM])


class MetadataStore:
    """Per-worker attributes, hostnames, the node and the slice-wide preempted flag; every change
    wakes the requests waiting for one."""

    def __init__(self, token_key: bytes | None = None) -> None:
        """`token_key`: the pod's token key (localpod.gcp.tokens): each VM's token names its service
        account. Without one (a bare store in a unit test) tokens name nobody any API knows."""
        self.token_key = token_key
        self.cond = threading.Condition()
        self._attributes: dict[int, dict[str, str]] = {}
        self._preempted = False
        self.maintenance_event = (
            "NONE"  # GCE: NONE, or TERMINATE_ON_HOST_MAINTENANCE while it lasts
        )
        self.hostnames: dict[int, str] = {}
        self.node = Node()

    def set_attributes(self, attributes: dict[int, dict[str, str]], hostnames: dict[int, str]):
        with self.cond:
            self._attributes = {i: dict(a) for i, a in attributes.items()}
            self.hostnames = dict(hostnames)
            self.cond.notify_all()

    def set_node(self, **fields) -> None:
        """Update Node fields (node_id, project, zone, service_account, scopes, ...)."""
        with self.cond:
            for name, value in fields.items():
                if not hasattr(self.node, name):
                    raise TypeError(f"metadata: no node field {name}")
                setattr(self.node, name, value)
            self.cond.notify_all()

    def token(self, email: str) -> dict:
        """The access token GCE's metadata server hands the VM for its service account."""
        if self.token_key is None:
            access = "unsigned"
        else:
            access = tokens.mint(self.token_key, email, tokens.METADATA_LIFETIME_S)
        return {"access_token": access, "expires_in": TOKEN_LIFETIME_S, "token_type": "Bearer"}

    def attributes(self, index: int) -> dict[str, str]:
        with self.cond:
            return dict(self._attributes.get(index, {}))

    @property
    def preempted(self) -> bool:
        return self._preempted

    def set_preempted(self, value: bool) -> None:
        with self.cond:
            self._preempted = value
            self.cond.notify_all()

    def set_maintenance_event(self, value: str) -> None:
        with self.cond:
            self.maintenance_event = value
            self.cond.notify_all()

    def tree(self, index: int) -> dict:
        """Worker `index`'s whole metadata tree: dicts are directories, str/list are values."""
        with self.cond:
            node = self.node
            name = self.hostnames.get(index, f"worker-{index}")
            attributes = dict(self._attributes.get(index, {}))
            attributes.setdefault("tpu-env", tpu_env(node, index, attributes))
            account = {"aliases": ["default"], "email": node.service_account}
            account["scopes"] = list(node.scopes)
            return {
                "instance": {
                    "attributes": attributes,
                    "hostname": f"{name}.{node.zone}.c.{node.project}.internal",
                    "id": str(1000 + index),
                    "name": name,
                    "zone": f"projects/{node.project_number}/zones/{node.zone}",
                    "preempted": "TRUE" if self._preempted else "FALSE",
                    "maintenance-event": self.maintenance_event,
                    "service-accounts": {"default": account, node.service_account: account},
                },
                "project": {"project-id": node.project, "numeric-project-id": node.project_number},
                "universe": {"universe-domain": "googleapis.com"},
            }


def tpu_env(node: Node, index: int, attributes: dict[str, str]) -> str:
    """`instance/attributes/tpu-env` as a TPU VM has it (`KEY: 'VALUE'` lines, sorted); the keys
    that describe this node, a subset of a real VM's (no topology or agent image keys)."""
    values = {
        "ACCELERATOR_TYPE": attributes.get("accelerator-type", ""),
        "CONSUMER_PROJECT_ID": node.project,
        "CONSUMER_PROJECT_NUMBER": node.project_number,
        "NODE_ID": node.node_id,
        "PREEMPTIBLE": "true" if node.preemptible else "false",
        "RUNTIME_VERSION": node.runtime_version,
        "SERVICE_NAME": "tpu.googleapis.com",
        "WORKER_ID": str(index),
        "ZONE": node.zone,
    }
    return "".join(f"{key}: '{value}'\n" for key, value in sorted(values.items()))


def _camel(key: str) -> str:
    head, *rest = key.split("-")
    return head + "".join(part.capitalize() for part in rest)


def _as_json(value, camel: bool = True):
    if isinstance(value, dict):
        return {
            (_camel(k) if camel else k): _as_json(v, camel and k not in _CAMEL_EXEMPT)
            for k, v in value.items()
        }
    return value


def resolve(
    tree: dict, path: str, query: dict[str, str], store: MetadataStore | None = None
) -> tuple[str, str] | None:
    """(body, content type) for `path` (relative to /computeMetadata/v1/), None for 404."""
    if path.endswith("/token") and path.startswith("instance/service-accounts/"):
        account = tree["instance"]["service-accounts"].get(path.split("/")[2])
        if account is None:
            return None
        token = (store or MetadataStore()).token(account["email"])
        return json.dumps(token), "application/json"
    node = tree
    for part in [p for p in path.split("/") if p]:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    alt = query.get("alt", "")
    if isinstance(node, dict):
        if query.get("recursive", "").lower() == "true" or alt == "json":
            camel = not path.rstrip("/").endswith(_CAMEL_EXEMPT)
            return json.dumps(_as_json(node, camel)), "application/json"
        lines = [f"{k}/" if isinstance(v, dict) else k for k, v in node.items()]
        lines += ["token"] if "email" in node else []  # a service account's directory
        return "".join(f"{line}\n" for line in sorted(lines)), "application/text"
    if alt == "json":
        return json.dumps(node), "application/json"
    text = "".join(f"{item}\n" for item in node) if isinstance(node, list) else node
    return text, "application/text"


def etag(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:16]


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
        self.send_header("ETag", etag(body))
        self.send_header("Content-Length", str(len(data)))
        if code == 405:
            self.send_header("Allow", "GET")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _not_allowed(self) -> None:
        self._send(405, "Method not allowed\n", "text/html")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed  # noqa: N815

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.headers.get("Metadata-Flavor", "").lower() != "google":
            return self._send(403, "Missing Metadata-Flavor:Google header.\n", "text/html")
        if self.headers.get("X-Forwarded-For"):
            return self._send(403, "Request had an X-Forwarded-For header.\n", "text/html")
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path in ("/", "/computeMetadata/", PREFIX.rstrip("/"), PREFIX):
            return self._send(200, "instance/\nproject/\nuniverse/\n")
        if not url.path.startswith(PREFIX):
            return self._send(404, "Not Found\n", "text/html")
        path = url.path[len(PREFIX) :]
        try:
            found = self.server.answer(path, query)
        except ValueError as err:
            return self._send(400, f"{err}\n", "text/html")
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
        """The answer now, or with `wait_for_change=true` the first one whose ETag differs from
        `last_etag` (default: the current one), or the current one after `timeout_sec`."""
        found = resolve(self.store.tree(self.index), path, query, self.store)
        if query.get("wait_for_change", "").lower() != "true":
            return found
        timeout = min(float(query.get("timeout_sec", MAX_WAIT_S)), MAX_WAIT_S)
        if timeout < 0:
            raise ValueError("timeout_sec must not be negative")
        baseline = query.get("last_etag") or (etag(found[0]) if found else None)
        deadline = time.monotonic() + timeout
        with self.store.cond:
            while True:
                found = resolve(self.store.tree(self.index), path, query, self.store)
                now = etag(found[0]) if found else None
                remaining = deadline - time.monotonic()
                if now != baseline or remaining <= 0:
                    return found
                self.store.cond.wait(remaining)


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
