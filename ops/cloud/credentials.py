"""Whose credentials ops' Google clients carry: one rule for every client (TPU, storage, OS Login).

- a token file (the local pod's operator: `endpoints.json` identities.operator.token_file, which
  `--access-token-file` gives gcloud too): that token, as it is;
- on a VM (`GCE_METADATA_HOST` set: a local pod's VM, or a GCE VM told its metadata server): the
  VM's service account, from the metadata server, as on GCP;
- otherwise Application Default Credentials (`gcloud auth application-default login`, or the
  metadata server on a GCE VM).
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from ops.cloud.slice import ProviderError

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
METADATA_HOST_ENV = "GCE_METADATA_HOST"
REREAD_EVERY = datetime.timedelta(minutes=10)
NO_ADC = (
    "no Google credentials: run `gcloud auth application-default login` (or set "
    "GOOGLE_APPLICATION_CREDENTIALS to a service account key)"
)


def read_token(path: str | Path) -> str:
    try:
        return Path(path).read_text().strip().splitlines()[0]
    except (OSError, IndexError) as err:
        raise ProviderError(f"access token file {path}: {getattr(err, 'strerror', err)}") from None


def from_token_file(path: str | Path):
    """A bearer token read from a file (its first line); a "refresh" reads the file again (its
    owner renews it: the local pod writes one valid while the pod is up), so a 401 still reaches
    the caller as google-api-core's Unauthorized, not as google-auth's RefreshError."""
    from google.oauth2.credentials import Credentials

    def reread(request, scopes=None):
        ahead = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + REREAD_EVERY
        return read_token(path), ahead

    return Credentials(token=read_token(path), refresh_handler=reread)


def credentials(token_file: str | Path | None = None):
    """The credentials for ops' clients, by the rule above."""
    if token_file:
        return from_token_file(token_file)
    if os.environ.get(METADATA_HOST_ENV):
        from google.auth import compute_engine

        return compute_engine.Credentials(scopes=SCOPES)
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        found, _ = google.auth.default(scopes=SCOPES)
    except DefaultCredentialsError:
        raise ProviderError(NO_ADC) from None
    return found
