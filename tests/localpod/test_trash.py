"""A recreated worker's old disk is deleted only while no worker boots (localpod.vm.trash).

Each test has its control: the same trash with the pod quiet is deleted, so a reaper that kept
everything (or deleted at once, as before) fails one of the pair.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from localpod.vm import trash


def _worker(root: Path, index: int, state: str | None, ended_ago: float = 60.0) -> None:
    tpupod = root / "workers" / str(index) / "tpupod"
    tpupod.mkdir(parents=True)
    if state is not None:
        doc = {"state": state, "updated": time.time() - ended_ago}
        (tpupod / "bootstrap.json").write_text(json.dumps(doc))


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


def test_quiet_only_when_every_boot_ended_a_while_ago(tmp_path: Path):
    assert trash.workers_quiet(tmp_path)  # no workers at all
    _worker(tmp_path, 0, "ok")
    assert trash.workers_quiet(tmp_path)
    _worker(tmp_path, 1, None)  # its startup script has not written anything yet
    assert not trash.workers_quiet(tmp_path)
    (tmp_path / "workers" / "1" / "tpupod" / "bootstrap.json").write_text(
        json.dumps({"state": "running", "updated": time.time() - 60})
    )
    assert not trash.workers_quiet(tmp_path)
    (tmp_path / "workers" / "1" / "tpupod" / "bootstrap.json").write_text(
        json.dumps({"state": "ok", "updated": time.time() - 1})
    )
    assert not trash.workers_quiet(tmp_path)  # ended, but the job is still starting
    assert trash.workers_quiet(tmp_path, settle_s=0.5)
    assert trash.workers_quiet(tmp_path, now=time.time() + trash.SETTLE_S)


def test_kept_while_a_worker_boots_then_deleted(tmp_path: Path):
    moved = _old_disk(tmp_path)
    _worker(tmp_path, 1, "running")
    reaper = trash.Reaper(tmp_path, poll_s=0.02).start()
    try:
        time.sleep(0.5)
        assert moved.exists() and any(moved.rglob("f*")), "deleted while a worker booted"
        boot = tmp_path / "workers" / "1" / "tpupod" / "bootstrap.json"
        boot.write_text(json.dumps({"state": "ok", "updated": time.time() - trash.SETTLE_S}))
        assert _wait(lambda: not moved.exists()), "never deleted once the pod was quiet"
    finally:
        reaper.stop()


def test_a_boot_beginning_pauses_the_deletion(tmp_path: Path):
    moved = _old_disk(tmp_path, files=5 * trash.BATCH)
    answers = iter([True])  # quiet for the first batch only, then a boot begins
    booting = {"now": True}
    reaper = trash.Reaper(tmp_path, quiet=lambda: next(answers, not booting["now"]), poll_s=0.02)
    reaper.start()
    try:
        time.sleep(0.5)
        left = sum(1 for _ in moved.rglob("*"))
        assert 0 < left < 5 * trash.BATCH, f"{left} entries left: not paused after one batch"
        booting["now"] = False
        assert _wait(lambda: not moved.exists())
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
