"""The pod's OS Login stand-in: `POST /v1/users/{email}:importSshPublicKey`, shaped like Google's.

On GCP the watcher's service account imports its own public key with the OS Login API and logs in
to the TPU workers (OS Login on, project keys blocked) as its POSIX user `sa_<uniqueId>`; instance
`ssh-keys` metadata is ignored there. Here the same: a key imported through this endpoint is
written under the pod's `oslogin/` directory, and the workers' SSH servers accept it for that
POSIX user only (localpod.sshserver); a key never imported is refused. The session runs as the
pod's login user (the pod cannot create Unix users), with the same passwordless sudo.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit

from localpod.loopback import LoopbackServer

DIR_ENV = "TPUPOD_OSLOGIN_DIR"  # set by the controller; the worker agents inherit it
_IMPORT = re.compile(r"/v1/users/(?P<email>[^/:]+):importSshPublicKey")
_KEY = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256) [A-Za-z0-9+/=]+( .*)?$")


def unique_id(email: str) -> str:
    """A service account's numeric uniqueId (21 digits), stable per email here."""
    return str(int(hashlib.sha256(email.encode()).hexdigest(), 16))[:21]


def posix_username(email: str) -> str:
    """OS Login's name for a service account: `sa_` + its uniqueId."""
    return f"sa_{unique_id(email)}"


def authorized_keys_for(username: str, directory: str | Path | None = None) -> Path | None:
    """The keys imported for `username`, None when there are none (or no OS Login here)."""
    base = directory or os.environ.get(DIR_ENV)
    if not base or not re.fullmatch(r"sa_[0-9]+", username):
        return None
    path = Path(base) / f"{username}.keys"
    return path if path.is_file() and path.stat().st_size else None


def import_key(directory: Path, email: str, key: str) -> dict:
    """Register `key` for `email`'s POSIX user; the LoginProfile Google answers with."""
    key = key.strip()
    if not _KEY.match(key):
        raise ValueError("key is not an OpenSSH public key line")
    user = posix_username(email)
    path = directory / f"{user}.keys"
    directory.mkdir(parents=True, exist_ok=True)
    keys = set(path.read_text().splitlines()) if path.exists() else set()
    keys.add(key)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(sorted(keys)) + "\n")
    os.replace(tmp, path)
    fingerprint = hashlib.sha256(key.split()[1].encode()).hexdigest()
    return {
        "loginProfile": {
            "name": email,
            "posixAccounts": [
                {
                    "primary": True,
                    "username": user,
                    "uid": str(1000 + int(unique_id(email)) % 60000),
                    "gid": str(1000 + int(unique_id(email)) % 60000),
                    "homeDirectory": f"/home/{user}",
                    "operatingSystemType": "LINUX",
                    "accountId": "tpupod-local",
                    "name": f"users/{email}/projects/tpupod-local",
                }
            ],
            "sshPublicKeys": {
                fingerprint: {
                    "key": key,
                    "fingerprint": fingerprint,
                    "name": f"users/{email}/sshPublicKeys/{fingerprint}",
                }
            },
        }
    }


class _Handler(BaseHTTPRequestHandler):
    server: OsLoginServer

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet by design
        pass

    def _reply(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        match = _IMPORT.fullmatch(urlsplit(self.path).path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if match is None:
            return self._reply(404, _error(404, "NOT_FOUND", f"No method POST {self.path}."))
        try:
            body = json.loads(raw or b"{}")
            profile = import_key(self.server.directory, unquote(match["email"]), body["key"])
        except (ValueError, KeyError, TypeError) as err:
            return self._reply(400, _error(400, "INVALID_ARGUMENT", str(err)))
        self._reply(200, profile)


def _error(code: int, status: str, message: str) -> dict:
    return {"error": {"code": code, "message": message, "status": status}}


class OsLoginServer(LoopbackServer):
    """`url` is the API root (Google's: https://oslogin.googleapis.com)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(_Handler)
        self.directory = Path(directory)
