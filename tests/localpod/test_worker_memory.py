"""Each local worker's memory (localpod.vm.memory): a tmpfs directory of its own, per pod, empty
at every boot, gone at `down`; what a boot empties goes to the pod memory's trash at once (the
trash reaper deletes it while the jobs train: tests/localpod/test_trash.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localpod.vm import memory


def test_each_pod_and_worker_has_its_own_tmpfs_directory(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert memory.pod_memory(a) != memory.pod_memory(b)
    assert memory.worker_memory(a, 0) != memory.worker_memory(a, 1)
    if memory.SHM.is_dir():
        assert memory.pod_memory(a).parent == memory.SHM


def test_a_boot_finds_its_memory_empty_and_down_releases_it(tmp_path: Path) -> None:
    root = tmp_path / "pod"
    try:
        first = memory.empty(root, 0)
        (first / "venv").mkdir()
        (first / "venv" / "lib.so").write_bytes(b"x" * 1000)
        other = memory.empty(root, 1)
        (other / "kept").write_text("worker 1 did not boot again")
        again = memory.empty(root, 0)
        assert again == first and list(again.iterdir()) == []
        assert (other / "kept").exists()
        (gone,) = memory.trash_dir(root).iterdir()  # renamed, not deleted inside the boot
        assert gone.name.startswith("worker-0-") and (gone / "venv" / "lib.so").is_file()
    finally:
        memory.release(root)
    assert not memory.pod_memory(root).exists()


def test_a_planted_directory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "pod"
    planted = memory.pod_memory(root)
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)  # as another user's could be: /dev/shm is everyone's
    try:
        with pytest.raises(RuntimeError, match="not a directory of this user's alone"):
            memory.empty(root, 0)
    finally:
        memory.release(root)


def test_the_memory_of_a_pod_whose_directory_is_gone_is_swept(tmp_path: Path) -> None:
    live, gone = tmp_path / "live", tmp_path / "gone"
    live.mkdir()
    gone.mkdir()
    try:
        memory.empty(live, 0)
        memory.empty(gone, 0)
        gone.rmdir()  # its test bed died before `down`; its tmp directory was cleaned later
        swept = memory.sweep_orphans()
        assert memory.pod_memory(gone) in swept and not memory.pod_memory(gone).exists()
        assert memory.pod_memory(live) not in swept and memory.worker_memory(live, 0).is_dir()
    finally:
        memory.release(live)
        memory.release(gone)
