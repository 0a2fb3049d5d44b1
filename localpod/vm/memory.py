"""Each worker VM's memory filesystem, as /dev/shm is on a TPU VM: a tmpfs directory of its own
(TPUPOD_RAM_DIR), empty at every create and every reboot, gone with the pod.

The bootstrap keeps environments there (bootstrap/startup.sh, env_home): a worker's directory
on the host's disk is its boot disk, and the host's /dev/shm is shared by every worker and
outlives them, so each worker gets a directory of its own under it, emptied where a real VM's
memory would be lost."""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from pathlib import Path

SHM = Path("/dev/shm")


def pod_memory(root: Path) -> Path:
    """The pod's tmpfs directory: named after its pod directory, so two pods never share one."""
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    return (SHM if SHM.is_dir() else root) / f"tpupod-pod-{digest}"


def worker_memory(root: Path, index: int) -> Path:
    return pod_memory(root) / f"worker-{index}"


def empty(root: Path, index: int) -> Path:
    """Worker `index` boots with empty memory: what its last boot held is renamed aside at once
    and deleted beside the boot (freeing memory is no work of the new VM's)."""
    path = worker_memory(root, index)
    if path.exists():
        aside = pod_memory(root) / f".gone-{index}-{time.time_ns()}"
        path.rename(aside)
        threading.Thread(target=shutil.rmtree, args=(aside, True), daemon=True).start()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def release(root: Path) -> None:
    """The pod is down: its workers' memory goes (including what `empty` had not deleted yet)."""
    shutil.rmtree(pod_memory(root), ignore_errors=True)
