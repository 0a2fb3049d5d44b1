"""Each worker VM's memory filesystem, as /dev/shm is on a TPU VM: a tmpfs directory of its own
(TPUPOD_RAM_DIR), empty at every boot, emptied whenever the VM stops (delete, preemption,
maintenance), gone with the pod.

The bootstrap keeps environments there (bootstrap/startup.sh, env_home): a worker's directory
on the host's disk is its boot disk, and the host's /dev/shm is shared by every worker and
outlives them, so each worker gets a directory of its own under it, emptied where a real VM's
memory would be lost. A pod whose test bed died without `down` leaves its directory behind: the
next `up` of any pod deletes those whose pod directory is gone."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
from pathlib import Path

SHM = Path("/dev/shm")
PREFIX = "tpupod-pod-"
OWNER = "pod-dir"  # in a pod's memory directory: the pod directory it belongs to
TRASH = ".trash"  # in a pod's memory directory: what stopped VMs' memory held (trash_dir)


def pod_memory(root: Path) -> Path:
    """The pod's tmpfs directory: named after its pod directory, so two pods never share one."""
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    return (SHM if SHM.is_dir() else root) / f"{PREFIX}{digest}"


def worker_memory(root: Path, index: int) -> Path:
    return pod_memory(root) / f"worker-{index}"


def _ours(root: Path) -> Path:
    """The pod's memory directory, made 0700 if new; refused if another user could have planted
    it (/dev/shm is every user's): its workers' environments run as code."""
    path = pod_memory(root)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RuntimeError(f"{path} is not a directory of this user's alone: remove it")
    if not (path / OWNER).exists():
        (path / OWNER).write_text(str(root.resolve()))
    return path


def trash_dir(root: Path) -> Path:
    """Where `empty` puts what a worker's memory held: the pod's trash reaper (localpod.vm.trash)
    deletes it while every job trains."""
    return pod_memory(root) / TRASH


def empty(root: Path, index: int) -> Path:
    """Worker `index`'s memory, empty: what it held is renamed into the trash at once (freeing
    memory is no work of the next VM's boot: its 0.7 GB of files were deleted while it booted)."""
    path = _ours(root) / f"worker-{index}"
    if path.exists():
        (path.parent / TRASH).mkdir(mode=0o700, exist_ok=True)
        path.rename(path.parent / TRASH / f"worker-{index}-{time.time_ns()}")
    path.mkdir(mode=0o700)
    return path


def release(root: Path) -> None:
    """The pod is down: its workers' memory goes (with its trash, what the reaper had not
    deleted yet)."""
    shutil.rmtree(pod_memory(root), ignore_errors=True)


def sweep_orphans() -> list[Path]:
    """Deletes this user's pod memory directories whose pod directory no longer exists (a test
    bed killed before `down`); returns them."""
    swept = []
    for path in SHM.glob(f"{PREFIX}*") if SHM.is_dir() else []:
        try:
            if path.lstat().st_uid != os.getuid() or Path((path / OWNER).read_text()).exists():
                continue
        except OSError:
            continue  # not ours to judge (no owner file: being made, or not ours)
        shutil.rmtree(path, ignore_errors=True)
        swept.append(path)
    return swept
