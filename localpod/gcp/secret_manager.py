"""The pod's Secret Manager stand-in: `projects.secrets.versions.access`, shaped like Google's
(https://secretmanager.googleapis.com, v1).

On GCP a job's secrets (`secrets:` in tpupod-job.yaml) are read at start by the worker's launcher
(bootstrap/jobrun.py) with the VM's token; here the same request reaches this server, whose root
the workers learn from TPUPOD_SECRETMANAGER_ENDPOINT (the only difference). Values live in the
pod's `secrets/` directory (0600), never in metadata or the bundle; `tpupod local secret NAME`
writes one there (what `gcloud secrets versions add` does on GCP), before or after `up`.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from localpod.gcp.gcp_errors import ApiError
from localpod.gcp.loopback import JsonApiHandler, LoopbackServer

ENDPOINT_ENV = "TPUPOD_SECRETMANAGER_ENDPOINT"
_ACCESS = re.compile(r"/v1/projects/(?P<project>[^/]+)/secrets/(?P<secret>[A-Za-z0-9_-]+)"
                     r"/versions/(?P<version>[^/:]+):access")  # fmt: skip
METHOD = "secretmanager.projects.secrets.versions.access"
RPC = "google.cloud.secretmanager.v1.SecretManagerService.AccessSecretVersion"
VERSION_TYPE = "secretmanager.googleapis.com/SecretVersion"


class _Handler(JsonApiHandler):
    server: SecretManagerServer
    service = "secretmanager.googleapis.com"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        match = _ACCESS.fullmatch(urlsplit(self.path).path)
        if match is None:
            return self.reply(404, _error(404, "NOT_FOUND", f"No method GET {self.path}."))
        name = f"projects/{match['project']}/secrets/{match['secret']}"
        version = f"{name}/versions/{match['version']}"
        gate = self.server.gate
        try:
            self.authorize(METHOD, RPC, gate.targets(METHOD, version, VERSION_TYPE) if gate else [])
        except ApiError as err:
            return self.reply_error(err)
        path = self.server.directory / match["secret"]
        if match["version"] not in ("latest", "1") or not path.is_file():
            return self.reply(404, _error(404, "NOT_FOUND", f"Secret [{name}] not found or "
                                          "has no versions."))  # fmt: skip
        data = path.read_bytes()
        self.reply(200, {"name": f"{name}/versions/1",
                         "payload": {"data": base64.b64encode(data).decode()}})  # fmt: skip


def _error(code: int, status: str, message: str) -> dict:
    return {"error": {"code": code, "message": message, "status": status}}


def write_secret(directory: Path, secret: str, data: bytes) -> None:
    """Owner-only, atomically: a reader sees the old value or the new one."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = directory / f".{secret}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, directory / secret)


class SecretManagerServer(LoopbackServer):
    """`url` is the API root (Google's: https://secretmanager.googleapis.com)."""

    def __init__(self, directory: Path, gate=None) -> None:
        super().__init__(_Handler, gate)
        self.directory = Path(directory)
