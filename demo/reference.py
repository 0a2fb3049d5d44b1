"""The demo's proof: the same job run once more without faults, and both runs' final committed
checkpoints compared bitwise (ops.commands.checkpoint_compare), whatever the job is.

The uninterrupted run reuses the pod's bootstrapped workers: every worker runs
`jobrun.py reference RUN_ID` over SSH, as root like the job itself: the job's own spec,
environment and process count, with its own run id (so its own run and checkpoint directory)
and attempt 1. Cheapest on 2 cores: no new VMs, a warm compilation cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

from ops.cloud.providers import provider_for
from ops.cloud.slice import Provider
from ops.cloud.target import ROOT, local_target
from ops.commands.checkpoint_compare import Comparison
from ops.fleet.workers import ROOT as REMOTE_ROOT
from ops.fleet.workers import WorkerGroup, as_root

REFERENCE_COMMAND = (
    f'R={REMOTE_ROOT}; cd -P "$R/current" && '
    '.venv/bin/python -I -S bootstrap/jobrun.py reference "{run_id}" > "$R/reference.out" 2>&1'
)


def pod_provider(pod_dir) -> Provider:
    """The one provider, pointed at the local pod's TPU API through its endpoints.json."""
    return provider_for(local_target(pod_dir))


def endpoints(pod_dir) -> dict:
    return json.loads((Path(pod_dir) / "endpoints.json").read_text())


def emulator_env(pod_dir) -> dict[str, str]:
    """This machine's environment plus what points Google's clients at the pod's bucket."""
    url = endpoints(pod_dir)["storage"].rstrip("/")
    return {**os.environ, "STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "x", "FSSPEC_GCS_TOKEN": "anon",
            "NO_GCE_CHECK": "true", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "JAX_PLATFORMS": "cpu"}  # fmt: skip


def read_object(pod_dir, path: str, attempts: int = 5) -> dict | None:
    """A JSON object from the pod's bucket (its GCS emulator, as named in endpoints.json); None
    if it is not there. 429, 5xx and dropped connections are retried with backoff, as a GCS
    client does: a bucket failing a share of requests (storage faults) must not hide the object."""
    try:
        found = endpoints(pod_dir)
        url, bucket = found["storage"].rstrip("/"), found["bucket"]
    except (OSError, ValueError, KeyError):
        return None
    obj = quote(path, safe="")
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(
                f"{url}/storage/v1/b/{bucket}/o/{obj}?alt=media", timeout=30
            ) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as err:
            if err.code != 429 and err.code < 500:
                return None
        except (OSError, ValueError):  # dropped, refused, cut short
            pass
        if attempt < attempts - 1:
            time.sleep(0.2 * 2**attempt)
    return None


def run_reference(pod_dir, run_id: str, timeout: float = 900.0) -> tuple[bool, float]:
    """The job once, uninterrupted, as run `run_id` on every worker; (all exited 0, seconds)."""
    started = time.time()
    command = as_root(REFERENCE_COMMAND.replace("{run_id}", run_id))
    workers = pod_provider(pod_dir).describe().workers
    with WorkerGroup(workers, retries=0) as group:
        outcomes = group.run(command, timeout=timeout)
    return all(o.ok for o in outcomes.values()), time.time() - started


def compare_runs(pod_dir, dir_a: str, dir_b: str) -> Comparison | None:
    """ops.commands.checkpoint_compare in a process of its own, pointed at the pod's bucket; None when
    it could not read a directory (its reason printed)."""
    done = subprocess.run(
        [sys.executable, "-m", "ops.commands.checkpoint_compare", dir_a, dir_b, "--json"],
        cwd=ROOT, env=emulator_env(pod_dir), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode not in (0, 1) or not lines:
        print((done.stderr.strip().splitlines() or ["compare failed"])[-1], file=sys.stderr)
        return None
    raw = json.loads(lines[-1])
    return Comparison(raw["step_a"], raw["step_b"], raw["leaves"], raw["files"], raw["differ"])
