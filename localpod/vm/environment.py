"""What a local worker sees: its environment variables and its metadata attributes.

The environment is what a TPU VM would give a login or the startup script, plus the standard
variables that point GCS clients at the emulator; the trainer never learns it runs locally.
Metadata is what the nodes.create request carried (the pod's own `up` renders it with
`contract.metadata`, the same functions the Pulumi program calls) plus the keys GCE adds per worker.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

from contract import metadata

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Passed through from the operator: locale and terminal, and the machine's TLS trust and proxies
# (what a VM image carries: a job's `python: uv` environment downloads its packages); never
# their venv or credentials.
_PASS_THROUGH = ("LANG", "LC_ALL", "TERM", "TZ", "USER", "LOGNAME", "SSL_CERT_FILE",
                 "SSL_CERT_DIR", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy",
                 "http_proxy", "no_proxy")  # fmt: skip


@functools.cache
def uv_executable() -> Path | None:
    """The operator's real uv binary (resolving pyenv-style shims, which need the operator's shell
    setup): the test bed's, never on a worker's PATH."""
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


def image_bin(pod_root: Path) -> Path:
    """The worker image's own programs: a Python with pip, as a TPU VM image carries one. It is
    the interpreter this test bed runs on, because uv's Python builds come from GitHub, which
    this sandbox cannot reach; uv and every package a worker installs itself (cold workers)."""
    bin_dir = pod_root / "image" / "bin"
    interpreter = Path(sys.executable).resolve()
    bin_dir.mkdir(parents=True, exist_ok=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for name in ("python3", version):
        link = bin_dir / name
        if not link.is_symlink() or link.resolve() != interpreter:
            link.unlink(missing_ok=True)
            link.symlink_to(interpreter)
    return bin_dir


def worker_env(
    *,
    home: Path,
    image: Path,
    tpupod_root: Path,
    metadata_host: str,
    emulator_url: str,
    devices_per_worker: int,
    memory_dir: Path,
    secretmanager_url: str | None = None,
) -> dict[str, str]:
    path = f"{image}:{SYSTEM_PATH}"
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
            # A worker is no VM of its own: the host's systemd (a developer's Linux) is not its.
            "TPUPOD_NO_SYSTEMD": "1",
            "GCE_METADATA_HOST": metadata_host,
            "STORAGE_EMULATOR_HOST": emulator_url,
            "TENSORSTORE_GCS_HTTP_URL": emulator_url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "abc",
            "FSSPEC_GCS_TOKEN": "anon",
            "NO_GCE_CHECK": "true",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_worker}",
            # The worker's own disk, empty at every create, as a new boot disk is.
            "UV_CACHE_DIR": str(tpupod_root.parent / "cache" / "uv"),
            "UV_PYTHON_INSTALL_DIR": str(tpupod_root.parent / "python"),
            # Its memory (/dev/shm on GCP), empty at every create and reboot (localpod.vm.memory).
            "TPUPOD_RAM_DIR": str(memory_dir),
        }
    )
    if secretmanager_url:  # the pod's Secret Manager (localpod.gcp.secret_manager)
        env["TPUPOD_SECRETMANAGER_ENDPOINT"] = secretmanager_url
    return env


# A loopback port nothing listens on: every HTTPS request (PyPI, files.pythonhosted.org, GitHub)
# through it is refused at once; the pod's own endpoints are plain HTTP and go direct.
_DEAD_PROXY = "http://127.0.0.1:9"


def registry_unreachable_env(addresses: list[str]) -> dict[str, str]:
    """A worker that can reach no package index or download site, as in a VPC without NAT: only
    the pod's own endpoints answer (the bucket as through Private Google Access, the metadata
    server, the other workers). They are named one by one: gRPC (JAX's coordinator) sends every
    channel through an HTTPS proxy unless no_proxy names its host, and not every client reads
    a CIDR there."""
    env = {name: _DEAD_PROXY for name in ("HTTPS_PROXY", "https_proxy")}
    env.update({name: "" for name in ("HTTP_PROXY", "http_proxy")})
    direct = ",".join(dict.fromkeys(["127.0.0.1", "localhost", *addresses]))
    env.update({name: direct for name in ("NO_PROXY", "no_proxy")})
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
    node_metadata: dict[str, str], addresses: list[str], accelerator: str,
    worker_key: str = metadata.AGENT_WORKER_NUMBER,
) -> dict[int, dict[str, str]]:  # fmt: skip
    """`instance/attributes/*` for each worker: the request's metadata plus GCE's own keys (the
    worker's index under `worker_key`: agent-worker-number on a TPU API node, worker-id on a
    Compute Engine TPU VM)."""
    common = dict(node_metadata)
    common[metadata.WORKER_NETWORK_ENDPOINTS] = metadata.network_endpoints_value(addresses)
    common[metadata.ACCELERATOR_TYPE] = accelerator
    return {index: {**common, worker_key: str(index)} for index in range(len(addresses))}
