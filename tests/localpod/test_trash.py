"""A recreated worker's old disk is deleted only while every worker's job trains
(localpod.vm.trash).

Each test has its control: the same trash with the pod quiet is deleted, so a reaper that kept
everything (or deleted at once, as before) fails one of the pair.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from localpod.state import PodPaths
from localpod.vm import memory, trash


def _worker(root: Path, index: int, boot: str | None, job: str | None = "training",
            beat_ago: float = 0.5, beat: str = "heartbeat") -> None:  # fmt: skip
    """A worker whose bootstrap.json says `boot` and whose status file says `job`, last written
    `beat_ago` s ago in field `beat` (None: no such file)."""
    tpupod = PodPaths(root).tpupod_root(index)
    tpupod.mkdir(parents=True, exist_ok=True)
    files = {
        "bootstrap.json": boot and {"state": boot, "updated": time.time()},
        "status.json": job and {"state": job, "step": 7, beat: time.time() - beat_ago},
    }
    for name, doc in files.items():
        (tpupod / name).unlink(missing_ok=True)
        if doc:
            (tpupod / name).write_text(json.dumps(doc))


def _old_disk(root: Path, files: int = 50) -> Path:
    disk = root / "workers" / "0"
    for i in range(files):
        (disk / "cache" / f"d{i % 7}").mkdir(parents=True, exist_ok=True)
        (disk / "cache" / f"d{i % 7}" / f"f{i}").write_bytes(b"x" * 100)
    (disk / "link").symlink_to(disk / "cache")
    moved = trash.move_to_trash(root, disk)
    assert moved is not None and not disk.exists()
    return moved


def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _state(pid: int) -> str | None:
    """The process's state letter (/proc/PID/stat): T when stopped; None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_quiet_only_while_every_job_trains(tmp_path: Path):
    paths = PodPaths(tmp_path)
    assert trash.workers_quiet(paths)  # no workers at all
    _worker(tmp_path, 0, "ok")
    assert trash.workers_quiet(paths)
    for boot, job, beat_ago, why in (
        (None, None, 0.5, "its startup script has not written anything yet"),
        ("running", None, 0.5, "booting"),
        ("failed", "training", 0.5, "its boot failed"),
        ("ok", None, 0.5, "booted, its job not started"),
        ("ok", "restoring", 0.5, "its job restoring (after a boot, a crash or a hang)"),
        ("ok", "compiling", 0.5, "its job compiling"),
        ("ok", "done", 0.5, "its job ended"),
        ("ok", "training", trash.FRESH_S + 1, "its job's heartbeat stale (stopped or hung)"),
    ):
        _worker(tmp_path, 1, boot, job, beat_ago)
        assert not trash.workers_quiet(paths), why
    _worker(tmp_path, 1, "ok", "training")
    assert trash.workers_quiet(paths)
    assert not trash.workers_quiet(paths, now=time.time() + trash.FRESH_S + 1)
    # A job writing only `step` and `time` (tpupod_job.progress, a progress regex) is read the
    # way the watch reads it (contract.status): fresh, and training since it names no state.
    _worker(tmp_path, 1, "ok", "training", beat="time")
    assert trash.workers_quiet(paths)
    _worker(tmp_path, 1, "ok", "training", beat_ago=trash.FRESH_S + 1, beat="time")
    assert not trash.workers_quiet(paths)


def test_kept_while_a_worker_boots_then_deleted(tmp_path: Path):
    moved = _old_disk(tmp_path)
    _worker(tmp_path, 1, "running", None)
    reaper = trash.Reaper(PodPaths(tmp_path), poll_s=0.02).start()
    try:
        time.sleep(0.5)
        assert moved.exists() and any(moved.rglob("f*")), "deleted while a worker booted"
        _worker(tmp_path, 1, "ok", "training")
        assert _wait(lambda: not moved.exists()), "never deleted once the pod was quiet"
    finally:
        reaper.stop()


def _slow_reaper(root: Path, sleep_s: float) -> tuple[trash.Reaper, dict, int]:
    """A reaper whose rm is a slow stand-in (it sleeps, then deletes): the stop and the continue
    are seen on a real process (the real rm is the other tests'). Returns the reaper, its quiet
    switch (on) and the pid of the rm it started."""
    quiet = {"now": True}
    slow_rm = ("sh", "-c", f'sleep {sleep_s}; exec rm -rf "$0"')
    reaper = trash.Reaper(PodPaths(root), quiet=lambda: quiet["now"], poll_s=0.02,
                          command=slow_rm)  # fmt: skip
    reaper.start()
    assert _wait(lambda: reaper.pids()), "no rm started while quiet"
    (pid,) = reaper.pids()
    return reaper, quiet, pid


def test_a_boot_beginning_stops_the_rm_until_quiet_again(tmp_path: Path):
    moved = _old_disk(tmp_path)
    reaper, quiet, pid = _slow_reaper(tmp_path, 1)
    try:
        quiet["now"] = False  # a boot begins
        assert _wait(lambda: _state(pid) == "T"), "the rm kept running while a worker booted"
        time.sleep(1.5)
        assert moved.exists(), "deleted while a worker booted"
        quiet["now"] = True
        assert _wait(lambda: not moved.exists()), "not continued once quiet again"
    finally:
        reaper.stop()


def test_stop_ends_a_stopped_rm_and_hands_the_rest_on(tmp_path: Path):
    moved = _old_disk(tmp_path)
    cut_short = tmp_path / "trash-leaving-1"  # an earlier pod's rm, killed before it finished
    cut_short.mkdir()
    reaper, quiet, pid = _slow_reaper(tmp_path, 30)
    quiet["now"] = False
    assert _wait(lambda: _state(pid) == "T")
    began = time.monotonic()
    reaper.stop()
    assert time.monotonic() - began < 3, "stop() waited for the rm"
    assert _state(pid) is None, "a stopped rm outlived the reaper"
    assert not moved.exists() and not (tmp_path / "trash").exists()
    assert _wait(lambda: not list(tmp_path.glob("trash-leaving-*"))), "the rest never deleted"


def test_an_entry_rm_cannot_delete_is_set_aside_not_retried(tmp_path: Path):
    moved = _old_disk(tmp_path)
    later = _old_disk(tmp_path)
    refuses_one = f'case "$0" in *{moved.name}) exit 1;; esac; exec rm -rf "$0"'
    reaper = trash.Reaper(PodPaths(tmp_path), quiet=lambda: True, poll_s=0.02,
                          command=("sh", "-c", refuses_one))  # fmt: skip
    reaper.start()
    try:
        assert _wait(lambda: not later.exists()), "one bad entry held up the ones behind it"
        time.sleep(0.3)
        assert (tmp_path / "trash" / trash.STUCK / moved.name).is_dir(), "not set aside"
        assert reaper.spawned == 2, f"{reaper.spawned} rm runs: the bad entry was retried"
    finally:
        reaper.stop()


def test_a_failing_look_at_the_pod_does_not_end_the_reaper(tmp_path: Path):
    moved = _old_disk(tmp_path)
    answers = iter([ValueError("torn file"), OSError("gone"), True])

    def quiet() -> bool:
        answer = next(answers, True)
        if isinstance(answer, Exception):
            raise answer
        return answer

    reaper = trash.Reaper(PodPaths(tmp_path), quiet=quiet, poll_s=0.02).start()
    try:
        assert _wait(lambda: not moved.exists()), "the reaper died on an exception"
    finally:
        reaper.stop()


def test_deleted_after_the_longest_wait_even_if_never_quiet(tmp_path: Path):
    moved = _old_disk(tmp_path)
    stale = moved.with_name(f"0-{time.time_ns() - int((trash.MAX_WAIT_S + 1) * 1e9)}")
    moved.rename(stale)
    fresh = _old_disk(tmp_path)
    reaper = trash.Reaper(PodPaths(tmp_path), quiet=lambda: False, poll_s=0.02).start()
    try:
        assert _wait(lambda: not stale.exists()), "a never-quiet pod fills its disk"
        time.sleep(0.3)
        assert fresh.exists(), "the entry that has not waited long was deleted too"
    finally:
        reaper.stop()


def test_move_to_trash_of_nothing(tmp_path: Path):
    assert trash.move_to_trash(tmp_path, tmp_path / "absent") is None
    assert not os.path.exists(tmp_path / "trash")


@pytest.fixture
def lost_memory(tmp_path: Path):
    """Worker 0's memory as its VM stopped (localpod.vm.memory.empty): in the pod memory's trash,
    holding a venv file; the pod's memory released afterwards."""
    (memory.empty(tmp_path, 0) / "venv").mkdir()
    (memory.worker_memory(tmp_path, 0) / "venv" / "lib.so").write_bytes(b"x" * 100)
    memory.empty(tmp_path, 0)
    (lost,) = memory.trash_dir(tmp_path).iterdir()
    yield lost
    memory.release(tmp_path)


def _reaper(root: Path, quiet=None) -> trash.Reaper:
    return trash.Reaper(PodPaths(root), quiet=quiet, poll_s=0.02).start()


def test_a_stopped_vms_memory_waits_for_quiet_too(tmp_path: Path, lost_memory: Path):
    """What a worker's memory held when its VM stopped is deleted by the same reaper, only once
    the pod is quiet: not by the controller while the next VMs boot."""
    _worker(tmp_path, 0, "running", None)
    reaper = _reaper(tmp_path)
    try:
        time.sleep(0.5)
        assert (lost_memory / "venv" / "lib.so").exists(), "deleted while a worker booted"
        _worker(tmp_path, 0, "ok", "training")
        assert _wait(lambda: not lost_memory.exists()), "never deleted once the pod was quiet"
        assert memory.worker_memory(tmp_path, 0).is_dir()  # the VM's own memory stays
    finally:
        reaper.stop()


def test_memory_short_of_room_is_freed_at_once_and_first(tmp_path: Path, lost_memory: Path,
                                                          monkeypatch):  # fmt: skip
    """Below the bootstrap's free-memory floor the next boots would unpack onto the disk (or run
    out): a stopped VM's memory goes at once, before older disks; those still wait for quiet."""
    monkeypatch.setattr(trash, "MEMORY_FLOOR_BYTES", 1 << 62)  # more than any tmpfs has free
    disk = _old_disk(tmp_path)
    reaper = _reaper(tmp_path, quiet=lambda: False)
    try:
        assert _wait(lambda: not lost_memory.exists()), "memory short of room was kept"
        time.sleep(0.3)
        assert disk.exists(), "an old disk went while the pod was not quiet"
    finally:
        reaper.stop()
