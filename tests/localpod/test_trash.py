"""A recreated worker's old disk is deleted only while no worker boots (localpod.vm.trash).

Each test has its control: the same trash with the pod quiet is deleted, so a reaper that kept
everything (or deleted at once, as before) fails one of the pair.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from localpod.vm import trash


def _worker(root: Path, index: int, boot: str | None, job: str | None = "training",
            beat_ago: float = 0.5) -> Path:  # fmt: skip
    """A worker whose bootstrap.json says `boot` and status.json `job` (None: no such file)."""
    tpupod = root / "workers" / str(index) / "tpupod"
    tpupod.mkdir(parents=True, exist_ok=True)
    for name, state, extra in (("bootstrap", boot, {"updated": time.time()}),
                               ("status", job, {"heartbeat": time.time() - beat_ago})):  # fmt: skip
        path = tpupod / f"{name}.json"
        path.unlink(missing_ok=True)
        if state is not None:
            path.write_text(json.dumps({"state": state, **extra}))
    return tpupod


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


def test_quiet_only_while_every_job_trains(tmp_path: Path):
    assert trash.workers_quiet(tmp_path)  # no workers at all
    _worker(tmp_path, 0, "ok")
    assert trash.workers_quiet(tmp_path)
    for boot, job, beat_ago, why in (
        (None, None, 0.5, "its startup script has not written anything yet"),
        ("running", None, 0.5, "booting"),
        ("ok", None, 0.5, "booted, its job not started"),
        ("ok", "restoring", 0.5, "its job restoring (after a boot, a crash or a hang)"),
        ("ok", "training", trash.FRESH_S + 1, "its job's heartbeat stale (stopped or hung)"),
    ):
        _worker(tmp_path, 1, boot, job, beat_ago)
        assert not trash.workers_quiet(tmp_path), why
    _worker(tmp_path, 1, "ok", "training")
    assert trash.workers_quiet(tmp_path)
    assert not trash.workers_quiet(tmp_path, now=time.time() + trash.FRESH_S + 1)


def test_kept_while_a_worker_boots_then_deleted(tmp_path: Path):
    moved = _old_disk(tmp_path)
    _worker(tmp_path, 1, "running", None)
    reaper = trash.Reaper(tmp_path, poll_s=0.02).start()
    try:
        time.sleep(0.5)
        assert moved.exists() and any(moved.rglob("f*")), "deleted while a worker booted"
        _worker(tmp_path, 1, "ok", "training")
        assert _wait(lambda: not moved.exists()), "never deleted once the pod was quiet"
    finally:
        reaper.stop()


def _state(pid: int) -> str:
    """The process's state letter (/proc/PID/stat): T when stopped."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_boot_beginning_stops_the_rm_until_quiet_again(tmp_path: Path):
    """A slow stand-in for rm (it sleeps, then deletes) shows the stop and the continue on a
    real process; the real rm is the other tests'."""
    moved = _old_disk(tmp_path)
    quiet = {"now": True}
    slow_rm = ("sh", "-c", 'sleep 1; exec rm -rf "$0"')
    reaper = trash.Reaper(tmp_path, quiet=lambda: quiet["now"], poll_s=0.02, command=slow_rm)
    reaper.start()
    try:
        assert _wait(lambda: reaper.rm is not None), "no rm started while quiet"
        rm = reaper.rm
        quiet["now"] = False  # a boot begins
        assert _wait(lambda: _state(rm.pid) == "T"), "the rm kept running while a worker booted"
        time.sleep(1.5)
        assert moved.exists(), "deleted while a worker booted"
        quiet["now"] = True
        assert _wait(lambda: not moved.exists()), "not continued once quiet again"
    finally:
        reaper.stop()


def test_deleted_after_the_longest_wait_even_if_never_quiet(tmp_path: Path):
    moved = _old_disk(tmp_path)
    stale = moved.with_name(f"0-{time.time_ns() - int((trash.MAX_WAIT_S + 1) * 1e9)}")
    moved.rename(stale)
    fresh = _old_disk(tmp_path)
    reaper = trash.Reaper(tmp_path, quiet=lambda: False, poll_s=0.02).start()
    try:
        assert _wait(lambda: not stale.exists()), "a never-quiet pod fills its disk"
        time.sleep(0.3)
        assert fresh.exists(), "the entry that has not waited long was deleted too"
    finally:
        reaper.stop()
    assert not fresh.exists(), "stop() leaves the trash behind"


def test_move_to_trash_of_nothing(tmp_path: Path):
    assert trash.move_to_trash(tmp_path, tmp_path / "absent") is None
