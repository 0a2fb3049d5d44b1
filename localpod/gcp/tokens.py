"""Access tokens of the local cloud: each names one identity (an email) and an expiry, signed with
the pod's own key, so every process of the pod (controller, storage emulator, worker agents) can
verify one without asking the process that issued it. A new pod has a new key: tokens die with it.

Shaped like Google's opaque OAuth tokens (`ya29.` ...): a client treats it as a bearer string. The
metadata servers issue them for their VM's service account (an hour, as GCE does); `tpupod local
up` writes one per identity to a file (`tpupod local endpoints --json`: identities[*].token_file),
valid while the pod is up, for gcloud's `--access-token-file` and tpupod's own operator clients.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from pathlib import Path

PREFIX = "ya29.local."
KEY_FILE = "iam/key"
METADATA_LIFETIME_S = 3599  # what a GCE metadata server's token has left when fresh
FILE_LIFETIME_S = 30 * 24 * 3600  # token files: the pod's key ends them sooner (a new pod)


def key_path(pod_dir: Path) -> Path:
    return Path(pod_dir) / KEY_FILE


def new_key(pod_dir: Path) -> bytes:
    """A fresh signing key for a pod being brought up (owner-only file)."""
    path = key_path(pod_dir)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key)
    return key


def read_key(pod_dir: Path) -> bytes:
    return key_path(pod_dir).read_bytes()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _sign(key: bytes, claims: str) -> str:
    return hmac.new(key, claims.encode(), hashlib.sha256).hexdigest()[:40]


def mint(key: bytes, email: str, lifetime_s: float = METADATA_LIFETIME_S) -> str:
    claims = _b64(json.dumps({"sub": email, "exp": int(time.time() + lifetime_s)}).encode())
    return f"{PREFIX}{claims}.{_sign(key, claims)}"


def verify(key: bytes, token: str) -> tuple[str | None, str]:
    """(email, "") for a valid token; (None, why) otherwise: "invalid" or "expired"."""
    if not token.startswith(PREFIX):
        return None, "invalid"
    claims, _, signature = token[len(PREFIX) :].rpartition(".")
    if not claims or not hmac.compare_digest(signature, _sign(key, claims)):
        return None, "invalid"
    try:
        decoded = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
        email, expiry = str(decoded["sub"]), float(decoded["exp"])
    except (ValueError, KeyError, TypeError):
        return None, "invalid"
    return (email, "") if time.time() < expiry else (None, "expired")


def write_token_file(path: Path, token: str) -> None:
    """Owner-only, the token alone (what gcloud's --access-token-file reads)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
