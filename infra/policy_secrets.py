"""The no-secrets-in-metadata rule: secret-looking keys and values with a known secret's shape."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Metadata keys that name a secret, and values that have a known secret's shape. Shapes, not
# words: a startup script may well say "token" while fetching one from the metadata server.
SECRET_KEY = re.compile(r"(secret|passw|token|api[-_]?key|private[-_]?key|credential)", re.I)
SECRET_VALUES = {
    "PEM private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "service account key JSON": re.compile(r'"private_key"\s*:'),
    "AWS access key id": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "Google API key": re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"),
    "Google OAuth access token": re.compile(r"\bya29\.[0-9A-Za-z_-]{20,}"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "Slack token": re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    "literal password/secret assignment": re.compile(
        r"(?i)\b\w*(password|passwd|secret|api_?key|access_?key)\w*\s*[:=]\s*['\"]?[A-Za-z0-9/+_.-]{12,}"
    ),
}


def no_secrets_in_metadata(
    resource_type: str, props: Mapping[str, Any], protect: bool
) -> list[str]:
    metadata = props.get("metadata") or {}
    violations = [
        f"metadata key {k!r} looks like a secret" for k in metadata if SECRET_KEY.search(str(k))
    ]
    for key, value in metadata.items():
        for what, pattern in SECRET_VALUES.items():
            if pattern.search(str(value)):
                violations.append(f"metadata {key!r} contains a {what}")
    return violations
