"""The pod's OS Login stand-in: `POST /v1/users/{email}:importSshPublicKey`, shaped like Google's.

On GCP the watcher's service account imports its own public key with the OS Login API and logs in
to the TPU workers (OS Login on, project keys blocked) as its POSIX user `sa_<uniqueId>`; instance
`ssh-keys` metadata is ignored there. Here the same: a key imported through this endpoint is
written under the pod's `oslogin/` directory, and the workers' SSH servers accept it for that
POSIX user only (localpod.vm.sshserver); a key never imported is refused. The session runs as the
pod's login user (the pod cannot create Unix users), with the same passwordless sudo.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from localpod.gcp.authz import Caller, Denied, Gate, member_of
from localpod.gcp.gcp_errors import ApiError
from localpod.gcp.loopback import JsonApiHandler, LoopbackServer

DIR_ENV = "TPUPOD_OSLOGIN_DIR"  # set by the controller; the worker agents inherit it
_IMPORT = re.compile(r"/v1/users/(?P<email>[^/:]+):importSshPublicKey")
METHOD = "oslogin.users.importSshPublicKey"
LOGIN_CHECK = "oslogin.login.admin"  # the catalog's entry for OS Login's check at an SSH login
RPC = "google.cloud.oslogin.v1.OsLoginService.ImportSshPublicKey"
_KEY = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256) [A-Za-z0-9+/=]+( .*)?$")


def unique_id(email: str) -> str:
    """A service account's numeric uniqueId (21 digits), stable per email here."""
    return str(int(hashlib.sha256(email.encode()).hexdigest(), 16))[:21]


def posix_username(email: str) -> str:
    """OS Login's name for a service account: `sa_` + its uniqueId."""
    return f"sa_{unique_id(email)}"


def authorized_keys_for(username: str, directory: str | Path | None = None,
                        instance: str = "-") -> Path | None:  # fmt: skip
    """The keys imported for `username`, None when there are none (or no OS Login here), or
    when IAM does not let its account log in with sudo on `instance` (roles/compute.osAdminLogin:
    OS Login's check at every login, here the pod's gate's)."""
    base = directory or os.environ.get(DIR_ENV)
    if not base or not re.fullmatch(r"sa_[0-9]+", username):
        return None
    path = Path(base) / f"{username}.keys"
    if not (path.is_file() and path.stat().st_size):
        return None
    return path if login_allowed(Path(base), username, instance) else None


def login_allowed(directory: Path, username: str, instance: str) -> bool:
    gate = Gate.for_pod(directory.parent)  # the pod's (OS Login's directory is in it)
    if gate is None:
        return True
    email = (directory / f"{username}.email").read_text().strip()
    name = f"projects/{gate.policy.project}/zones/-/instances/{instance}"
    targets = gate.targets(LOGIN_CHECK, name, "compute.googleapis.com/Instance")
    try:
        gate.check(Caller(member_of(email), via="ssh"), "oslogin.googleapis.com", LOGIN_CHECK,
                   targets)  # fmt: skip
    except Denied:
        return False
    return True


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
    (directory / f"{user}.email").write_text(email + "\n")
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


class _Handler(JsonApiHandler):
    server: OsLoginServer
    service = "oslogin.googleapis.com"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        match = _IMPORT.fullmatch(urlsplit(self.path).path)
        raw = self.read_body()
        if match is None:
            return self.reply(404, _error(404, "NOT_FOUND", f"No method POST {self.path}."))
        email = unquote(match["email"])
        try:  # no IAM permission: a user (a service account too) manages its own profile only
            caller = self.authorize(METHOD, RPC, [])
            if self.server.gate is not None and caller.email != email:
                raise ApiError("PERMISSION_DENIED", f"{caller.email} may not manage the login "
                               f"profile of users/{email}.")  # fmt: skip
        except ApiError as err:
            return self.reply_error(err)
        try:
            body = json.loads(raw or b"{}")
            profile = import_key(self.server.directory, email, body["key"])
        except (ValueError, KeyError, TypeError) as err:
            return self.reply(400, _error(400, "INVALID_ARGUMENT", str(err)))
        self.reply(200, profile)


def _error(code: int, status: str, message: str) -> dict:
    return {"error": {"code": code, "message": message, "status": status}}


class OsLoginServer(LoopbackServer):
    """`url` is the API root (Google's: https://oslogin.googleapis.com)."""

    def __init__(self, directory: Path, gate=None) -> None:
        super().__init__(_Handler, gate)
        self.directory = Path(directory)
