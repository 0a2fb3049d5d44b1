"""Where a run's checkpoints live, for the commands that read them (`tpupod checkpoints`, the
bitwise comparison): the run's bucket and prefix and a storage client that reaches it, on the
local pod (its endpoints and node spec) or on GCP (`--workdir` and Application Default
Credentials)."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ops.cli import CliError
from ops.cloud.credentials import credentials
from ops.cloud.slice import ProviderError
from ops.cloud.target import LOCAL, default_pod_dir


@dataclass
class Run:
    workdir: str
    bucket: str
    prefix: str  # the workdir's path in the bucket, without a trailing slash
    client: object  # google.cloud.storage.Client


def locate(args: argparse.Namespace) -> Run:
    """The run's bucket and prefix, and a storage client that reaches it."""
    from google.cloud import storage

    if args.stack == LOCAL:
        path = Path(args.pod_dir or default_pod_dir()) / "endpoints.json"
        try:
            ep = json.loads(path.read_text())
            url, bucket = ep["storage"].rstrip("/"), ep["bucket"]
            token_file = ep["identities"]["operator"]["token_file"]
        except OSError:
            raise CliError(f"no local pod is up in {path.parent} (run `tpupod local up`)") from None
        except (ValueError, KeyError) as err:
            raise CliError(f"{path}: unreadable endpoints ({err!r}); restart the pod") from None
        try:
            creds = credentials(token_file)
        except ProviderError as err:
            raise CliError(str(err)) from None
        # tensorstore (the readability check) finds the emulator, and sends the operator's
        # token, through these.
        os.environ["TENSORSTORE_GCS_HTTP_URL"] = url
        os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = creds.token
        client = storage.Client(project=ep.get("project", "tpupod-local"), credentials=creds,
                                client_options={"api_endpoint": url})  # fmt: skip
        workdir = args.workdir or run_dir_of(ep, path)
    else:
        if not args.workdir:
            raise CliError(f"--stack {args.stack}: pass --workdir gs://BUCKET/PREFIX (the run's "
                           "workdir, as the trainer's --workdir names it)")  # fmt: skip
        workdir = args.workdir
        try:
            client = storage.Client()
        except Exception as err:  # noqa: BLE001 - google.auth's many credential errors
            raise CliError(f"no Google credentials ({str(err).splitlines()[0][:160]}): run "
                           "`gcloud auth application-default login`") from None  # fmt: skip
    if not workdir.startswith("gs://") or len(workdir.rstrip("/")) <= len("gs://"):
        raise CliError(f"--workdir {workdir}: expected gs://BUCKET/PREFIX")
    bucket, _, prefix = workdir.removeprefix("gs://").partition("/")
    return Run(workdir.rstrip("/"), bucket, prefix.strip("/"), client)


def run_dir_of(endpoints: dict, where: Path) -> str:
    """The run the pod's node runs: metadata `tpupod-run-dir` of the node spec it names."""
    from contract.metadata import RUN_DIR
    from ops.cloud.target import spec_metadata

    try:
        spec = json.loads(Path(endpoints["spec_file"]).read_text())
        return spec_metadata(spec)[RUN_DIR]
    except (OSError, ValueError, KeyError, TypeError):
        raise CliError(
            f"{where}: the pod's node spec names no run directory; pass --workdir"
        ) from None
