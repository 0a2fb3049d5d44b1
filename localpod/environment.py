"""What a local worker sees: its environment variables and its metadata attributes.

The environment is what a TPU VM would give a login or the startup script, plus the standard
variables that point GCS clients at the emulator; the trainer never learns it runs locally.
Metadata is what the nodes.create request carried (the pod's own `up` renders it with
`infra.metadata`, the same functions the Pulumi program calls) plus the keys GCE adds per worker.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from infra import metadata

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Passed through from the operator: locale and terminal, and the machine's TLS trust and proxies
# (what a VM image carries: a job's `python: uv` environment downloads its packages); never
# their venv or credentials.
_PASS_THROUGH = ("LANG", "LC_ALL", "TERM", "TZ", "USER", "LOGNAME", "SSL_CERT_FILE",
                 "SSL_CERT_DIR", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy",
                 "http_proxy", "no_proxy")  # fmt: skip


@functools.cache
def uv_executable() -> Path | None:
    """The real uv binary (resolving pyenv-style shims, which need the operator's shell setup)."""
    found = shutil.which("uv")
    if found and "/shims/" in found:
        try:
            out = subprocess.run(
                ["pyenv", "which", "uv"], capture_output=True, text=True, timeout=10, check=True
            )
            found = out.stdout.strip() or found
        except (OSError, subprocess.SubprocessError):
            pass
    return Path(found).resolve() if found else None


@functools.cache
def _uv_dir(kind: str) -> str | None:
    uv = uv_executable()
    if uv is None:
        return None
    try:
        out = subprocess.run([str(uv), kind, "dir"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def uv_settings() -> dict[str, str]:
    """Share the operator's uv cache and Python installs, so worker installs are warm."""
    settings = {}
    if cache := _uv_dir("cache"):
        settings["UV_CACHE_DIR"] = cache
    if python_dir := _uv_dir("python"):
        settings["UV_PYTHON_INSTALL_DIR"] = python_dir
    return settings


def worker_env(
    *,
    home: Path,
    tpupod_root: Path,
    metadata_host: str,
    emulator_url: str,
    devices_per_worker: int,
    secretmanager_url: str | None = None,
) -> dict[str, str]:
    uv = uv_executable()
    path = f"{uv.parent}:{SYSTEM_PATH}" if uv else SYSTEM_PATH
    # The image's other Pythons, after the system's: a job's lock may need one uv cannot
    # download here (its downloads come from GitHub), e.g. MaxText's 3.12.
    if extra := os.environ.get("TPUPOD_LOCAL_PYTHON_DIRS"):
        path = f"{path}:{extra}"
    env = {k: os.environ[k] for k in _PASS_THROUGH if k in os.environ}
    env.update(
        {
            "HOME": str(home),
            "PATH": path,
            "SHELL": "/bin/bash",
            "TPUPOD_ROOT": str(tpupod_root),
            "TPUPOD_LOCAL_POD": "1",
            "GCE_METADATA_HOST": metadata_host,
            "STORAGE_EMULATOR_HOST": emulator_url,
            "TENSORSTORE_GCS_HTTP_URL": emulator_url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "abc",
            "FSSPEC_GCS_TOKEN": "anon",
            "NO_GCE_CHECK": "true",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_worker}",
            **uv_settings(),
        }
    )
    if secretmanager_url:  # the pod's Secret Manager (localpod.secret_manager)
        env["TPUPOD_SECRETMANAGER_ENDPOINT"] = secretmanager_url
    return env


def accelerator_type(workers: int, devices_per_worker: int) -> str:
    """Shaped like `v4-32` (generation-cores) so parsers of the real value still work."""
    return f"cpu-{workers * devices_per_worker}"


def pod_metadata(
    *, bucket: str, bundle_object: str, bundle_sha256: str, stack: str, job_json: str,
    run_id: str, coordinator_port: int, script: str | None,
) -> dict[str, str]:  # fmt: skip
    """The pod's own node metadata: the Pulumi program's keys (no uv group: CPU workers)."""
    return metadata.worker_metadata(
        bucket=bucket,
        bundle_object=bundle_object,
        bundle_sha256=bundle_sha256,
        stack=stack,
        job_json=job_json,
        run_id=run_id,
        uv_group="",
        coordinator_port=coordinator_port,
        script=script,
    )


def worker_attributes(
    node_metadata: dict[str, str], addresses: list[str], accelerator: str
) -> dict[int, dict[str, str]]:
    """`instance/attributes/*` for each worker: the request's metadata plus GCE's own keys."""
    common = dict(node_metadata)
    common[metadata.WORKER_NETWORK_ENDPOINTS] = metadata.network_endpoints_value(addresses)
    common[metadata.ACCELERATOR_TYPE] = accelerator
    return {
        index: {**common, metadata.AGENT_WORKER_NUMBER: str(index)}
        for index in range(len(addresses))
    }
