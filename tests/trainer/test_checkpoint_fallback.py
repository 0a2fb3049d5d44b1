"""Checkpoints on the GCS emulator: OCDBT's files on the bucket, steps of the previous (plain)
format restored, and a resume past an unreadable newest step (a truncated data file, a deleted
`state/`) that still ends bitwise equal to the uninterrupted run; nothing readable: exit 2, one
line, every object left as it was."""

from __future__ import annotations

import gcsfs
import pytest
from trainer_testlib import free_port, multi_args, run_ok, summary

from trainer.status import read_status

WD = "gs://tpupod-test/runs/fallback"
CKPT = f"{WD}/checkpoints"
# Synchronous saves: every fourth step is committed before the next one (an async save still
# writing when the next falls due would be coalesced into a later step, trainer/checkpoint.py).
SETS = ["--set", "checkpoint_every=4", "--set", "keep_latest=3", "--set", "checkpoint_async=false"]


def _objects(fs, prefix: str = CKPT) -> dict[str, int]:
    fs.invalidate_cache()
    base = prefix.removeprefix("gs://") + "/"
    return {k.removeprefix(base): int(v["size"]) for k, v in fs.find(prefix, detail=True).items()}


def _steps(fs) -> list[str]:
    return sorted({name.split("/")[0] for name in _objects(fs)})


def _truncate_largest(fs, step: int) -> str:
    files = {k: v for k, v in _objects(fs, f"{CKPT}/{step}").items()}
    largest = max(files, key=files.get)
    path = f"{CKPT}/{step}/{largest}"
    fs.pipe(path, fs.cat(path)[: files[largest] // 3])
    return largest


def _fallback_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if "is unreadable" in x]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.mark.slow  # the old plain format and fallback on gs://; test_checkpoint_verify covers fallback in CI; CI stays under 20 minutes
def test_ocdbt_files_old_format_and_fallback_past_unreadable_steps(spawn, tmp_path, gcs_emulator):
    fs = gcsfs.GCSFileSystem()
    base = ["--config", "tiny", "--steps", 12, "--workdir", WD, *SETS]
    status_file = tmp_path / "status.json"
    # The previous format (no OCDBT), run to the end: the reference fingerprint.
    run_ok(spawn, [*base, "--set", "checkpoint_format=plain"], tmp_path, "plain", env=gcs_emulator)
    reference = summary(WD)["params_fingerprint"]
    assert _steps(fs) == ["12", "4", "8"]
    assert not any("ocdbt" in name for name in _objects(fs))

    # 1. Newest step truncated: one line naming it, restore from step 8 (plain, read by an OCDBT
    # run), the step set aside whole, the run ends equal; its new step 12 is OCDBT.
    before = {k: v for k, v in _objects(fs).items() if k.startswith("12/")}
    _truncate_largest(fs, 12)
    t = run_ok(spawn, [*base, "--status-file", status_file], tmp_path, "trunc", env=gcs_emulator)
    line = _fallback_line(t.stderr)
    assert "checkpoint step 12 is unreadable" in line and "restoring step 8" in line, line
    events = {r["event"]: r for r in t.lines() if "event" in r}
    assert events["checkpoint_fallback"]["step"] == 12 and events["restored"]["step"] == 8
    moved = events["checkpoint_fallback"]["moved_to"]
    assert moved.startswith("12.unreadable-")
    aside = {k.removeprefix(moved + "/") for k in _objects(fs) if k.startswith(moved + "/")}
    assert aside == {k.removeprefix("12/") for k in before}
    assert read_status(status_file).message.startswith("checkpoint_fallback: ")
    assert summary(WD)["params_fingerprint"] == reference
    new12 = [k.removeprefix("12/") for k in _objects(fs) if k.startswith("12/")]
    assert "state/manifest.ocdbt" in new12, new12
    assert "state/ocdbt.process_0/manifest.ocdbt" in new12, new12
    assert any(k.startswith("state/ocdbt.process_0/d/") for k in new12), new12

    # 2. Newest step's state/ deleted: the same fallback (its manifest says first what is gone).
    fs.rm(f"{CKPT}/12/state", recursive=True)
    t = run_ok(spawn, base, tmp_path, "nostate", env=gcs_emulator)
    line = _fallback_line(t.stderr)
    assert "step 12 is unreadable (state/" in line and "verification failed: missing" in line
    assert "restoring step 8" in line, line
    assert summary(WD)["params_fingerprint"] == reference

    # 3. Every committed step truncated: one line, exit 2, every object as it was.
    for step in (4, 8, 12):
        _truncate_largest(fs, step)
    listing = _objects(fs)
    bad = spawn(base, tmp_path, "none", env=gcs_emulator)
    assert bad.wait() == 2, bad.stderr[-3000:]
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no readable checkpoint in") and "step 12 (" in last, last
    assert "Traceback" not in bad.stderr
    assert _objects(fs) == listing


@pytest.mark.slow  # two processes agreeing on a fallback; single-process fallback is in CI
def test_two_processes_fall_back_together(spawn, tmp_path, gcs_emulator):
    """The pod's shape: two processes on one bucket. Process 1's own data file of the newest step
    is cut short: both restore the step before it, both save the steps after it again (a process
    that still listed the moved step would skip a save the other makes, and hang), and the run
    ends equal to the uninterrupted one."""
    fs = gcsfs.GCSFileSystem()
    wd = "gs://tpupod-test/runs/two"

    def pod(name):
        port = free_port()
        procs = [spawn(["--config", "tiny", "--steps", 10, "--workdir", wd, *SETS,
                        *multi_args(port, 2, i)], tmp_path, f"{name}.{i}", env=gcs_emulator)
                 for i in range(2)]  # fmt: skip
        for p in procs:
            assert p.wait() == 0, p.stderr[-3000:]
        return procs

    pod("ref")
    reference = summary(wd)["params_fingerprint"]
    step10 = _objects(fs, f"{wd}/checkpoints/10")
    own = max((k for k in step10 if "ocdbt.process_1/d/" in k), key=step10.get)
    path = f"{wd}/checkpoints/10/{own}"
    fs.pipe(path, fs.cat(path)[: step10[own] // 3])
    again = pod("again")
    assert "checkpoint step 10 is unreadable" in _fallback_line(again[0].stderr)
    assert summary(wd)["params_fingerprint"] == reference
    steps = sorted(n for n in {k.split("/")[0] for k in _objects(fs, f"{wd}/checkpoints")})
    assert [s for s in steps if s.isdigit()] == ["10", "4", "8"], steps
    assert [s for s in steps if not s.isdigit()][0].startswith("10.unreadable-"), steps
