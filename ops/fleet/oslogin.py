"""The watcher's way in to the workers: OS Login for its own service account, no secret anywhere.

At every start (systemd's ExecStartPre) the watcher makes an SSH key pair on its own disk if it has
none, imports the public half with the OS Login API (`users.importSshPublicKey`, as
`gcloud compute os-login ssh-keys add` does) and writes `TPUPOD_SSH_USER=<POSIX user>` for `watch`.
The TPU nodes run with OS Login on and project keys blocked, so instance `ssh-keys` metadata would
be ignored anyway; `roles/compute.osAdminLogin` (infra/watcher_vm.py) gives the login its sudo.
On the local pod the endpoint is the pod's stand-in (endpoints.json `oslogin`, localpod.gcp.oslogin).

`python -m ops.fleet.oslogin --key FILE --env-out FILE [--endpoint URL] [--email EMAIL] [--ttl-hours N]`
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.parse
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

GOOGLE = "https://oslogin.googleapis.com"
ENDPOINT_ENV = "TPUPOD_OSLOGIN_ENDPOINT"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


class OsLoginError(Exception):
    """The key could not be imported: one line saying why."""


def ensure_key(path: Path) -> str:
    """The public key line of `path` (an OpenSSH ed25519 key, 0600), made if missing."""
    pub = path.with_name(path.name + ".pub")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(private)
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        pub.write_bytes(public + b" tpupod-watcher\n")
    return pub.read_text().strip()


def metadata_email() -> str:
    """The VM's own service account, from the metadata server."""
    import urllib.request

    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    url = f"http://{host}/computeMetadata/v1/instance/service-accounts/default/email"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.read().decode().strip()
    except OSError as err:
        raise OsLoginError(f"no service account email from the metadata server: {err}") from None


def import_key(endpoint: str, email: str, public_key: str, ttl_hours: float = 0,
               token_file: str | None = None) -> str:  # fmt: skip
    """users.importSshPublicKey as `email` itself (a user manages its own login profile only);
    returns the primary POSIX username. Credentials: `token_file`'s, else the VM's own account
    (its metadata server), as on GCP (ops.cloud.credentials)."""
    from google.auth.transport.requests import AuthorizedSession

    from ops.cloud.credentials import credentials
    from ops.cloud.slice import ProviderError

    try:
        creds = credentials(token_file)
    except ProviderError as err:
        raise OsLoginError(str(err)) from None
    body: dict = {"key": public_key}
    if ttl_hours:
        body["expirationTimeUsec"] = str(int((time.time() + ttl_hours * 3600) * 1e6))
    url = f"{endpoint}/v1/users/{urllib.parse.quote(email, safe='@')}:importSshPublicKey"
    try:
        response = AuthorizedSession(creds).post(url, json=body, timeout=30)
    except OSError as err:
        raise OsLoginError(f"OS Login API at {endpoint} unreachable: {err}") from None
    if response.status_code != 200:
        message = (response.json().get("error") or {}).get("message", response.text[:200])
        raise OsLoginError(f"importSshPublicKey for {email}: HTTP {response.status_code} {message}")
    accounts = response.json().get("loginProfile", {}).get("posixAccounts") or []
    primary = next((a for a in accounts if a.get("primary")), accounts[0] if accounts else None)
    if not primary:
        raise OsLoginError(f"OS Login profile of {email} has no POSIX account")
    return primary["username"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.fleet.oslogin", description=__doc__)
    parser.add_argument("--key", type=Path, required=True, help="private key file (made if absent)")
    parser.add_argument("--env-out", type=Path, required=True, help="writes TPUPOD_SSH_USER=...")
    parser.add_argument("--endpoint", default=os.environ.get(ENDPOINT_ENV, GOOGLE))
    parser.add_argument("--email", help="the service account [the VM's, from metadata]")
    parser.add_argument("--ttl-hours", type=float, default=0, help="key expiry (0: none)")
    args = parser.parse_args(argv)
    try:
        public = ensure_key(args.key)
        email = args.email or metadata_email()
        user = import_key(args.endpoint.rstrip("/"), email, public, args.ttl_hours)
    except OsLoginError as err:
        print(f"ops.fleet.oslogin: {err}", file=sys.stderr)
        return 2
    args.env_out.write_text(f"TPUPOD_SSH_USER={user}\nTPUPOD_SSH_KEY={args.key}\n")
    print(json.dumps({"email": email, "user": user}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
