"""The infra -> worker seam: the metadata keys a TPU VM carries.

Pure Python (no Pulumi import) so that the Pulumi program and the local pod's metadata server
render exactly the same keys. The startup script reads these and nothing else.
"""

from __future__ import annotations

from pathlib import Path

STARTUP_SCRIPT = "startup-script"
BUCKET = "tpupod-bucket"
BUNDLE_OBJECT = "tpupod-bundle-object"
BUNDLE_SHA256 = "tpupod-bundle-sha256"
STACK = "tpupod-stack"
JOB = "tpupod-job"  # the job's spec as JSON (contract.job.JobSpec.to_json)
RUN_ID = "tpupod-run-id"
RUN_DIR = "tpupod-run-dir"  # gs://BUCKET/runs/<stack>/<run id>: this run's checkpoints and logs
# Set only by recovery on the node it creates (ops): the job's attempt at that boot.
ATTEMPT = "tpupod-attempt"
COMPILE_CACHE = "tpupod-compile-cache"
UV_GROUP = "tpupod-uv-group"
COORDINATOR_PORT = "tpupod-coordinator-port"

# Set by GCE / the TPU runtime itself, never by the Pulumi program.
AGENT_WORKER_NUMBER = "agent-worker-number"
# A TPU VM's index on Compute Engine, as a guide that builds TPU7x slices from a workload policy
# reports it (not in Google's docs: unverified); the startup script takes either key.
WORKER_ID = "worker-id"
WORKER_NETWORK_ENDPOINTS = "worker-network-endpoints"
ACCELERATOR_TYPE = "accelerator-type"

# JAX's own default coordinator port for Cloud TPU (jax/_src/clusters/cloud_tpu_cluster.py).
DEFAULT_COORDINATOR_PORT = 8482
# GCE rejects metadata above 512 KiB in total; stay far below it.
METADATA_LIMIT_BYTES = 512 * 1024
STARTUP_SCRIPT_PATH = Path(__file__).resolve().parent.parent / "bootstrap" / "startup.sh"


def startup_script() -> str:
    """The startup script exactly as a worker receives it."""
    return STARTUP_SCRIPT_PATH.read_text()


def run_dir(bucket: str, stack: str, run_id: str) -> str:
    """Where one run keeps everything (checkpoints, summaries, job logs): the same for every
    worker, attempt and recreate of that run; a new run id is a new directory."""
    return f"gs://{bucket}/runs/{stack}/{run_id}"


def worker_metadata(
    *,
    bucket: str,
    bundle_object: str,
    bundle_sha256: str,
    stack: str,
    job_json: str,
    run_id: str,
    uv_group: str = "tpu",
    coordinator_port: int = DEFAULT_COORDINATOR_PORT,
    script: str | None = None,
) -> dict[str, str]:
    """Every tpupod key of one slice; the same for all of its workers."""
    return {
        STARTUP_SCRIPT: startup_script() if script is None else script,
        BUCKET: bucket,
        BUNDLE_OBJECT: bundle_object,
        BUNDLE_SHA256: bundle_sha256,
        STACK: stack,
        JOB: job_json,
        RUN_ID: run_id,
        RUN_DIR: run_dir(bucket, stack, run_id),
        COMPILE_CACHE: f"gs://{bucket}/compile-cache/{stack}",
        UV_GROUP: uv_group,
        COORDINATOR_PORT: str(coordinator_port),
    }


def network_endpoints_value(addresses: list[str]) -> str:
    """`worker-network-endpoints` in the TPU VM's `name:id:ip` triple format, as JAX parses it."""
    return ",".join(f"unknown:unknown:{address}" for address in addresses)
