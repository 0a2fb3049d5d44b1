"""Checkpoint content is verified before it is trusted (trainer/manifest.py): every committed
step carries a manifest of its files' sizes and CRC32Cs. Four newest steps damaged four ways
(half of a file cut off, bytes flipped in place, one file deleted, the manifest emptied) are each
reported in one line, set aside, and the run resumes from the step before them all and ends
bitwise equal to the uninterrupted run. Before manifests, the flipped bytes were restored without
a word."""

from __future__ import annotations

import gcsfs
from trainer_testlib import run_ok, summary

from trainer.manifest import NAME

WD = "gs://tpupod-test/runs/verify"
CKPT = f"{WD}/checkpoints"
SETS = ["--set", "checkpoint_every=4", "--set", "keep_latest=5", "--set", "checkpoint_async=false"]


def _files(fs, step: int) -> dict[str, int]:
    fs.invalidate_cache()
    base = f"{CKPT}/{step}".removeprefix("gs://") + "/"
    found = fs.find(f"{CKPT}/{step}", detail=True).items()
    return {k.removeprefix(base): int(v["size"]) for k, v in found}


def _largest(fs, step: int) -> tuple[str, int]:
    files = {k: v for k, v in _files(fs, step).items() if k != NAME}
    name = max(files, key=files.get)
    return f"{CKPT}/{step}/{name}", files[name]


def test_damaged_steps_are_refused_one_line_each_and_the_run_ends_equal(
    spawn, tmp_path, gcs_emulator
):
    fs = gcsfs.GCSFileSystem()
    base = ["--config", "tiny", "--steps", 20, "--workdir", WD, *SETS]
    run_ok(spawn, base, tmp_path, "ref", env=gcs_emulator)
    reference = summary(WD)["params_fingerprint"]
    for step in (4, 8, 12, 16, 20):
        assert NAME in _files(fs, step), step  # every committed step carries its manifest

    path, size = _largest(fs, 20)  # 1. half of the largest file cut off
    fs.pipe(path, fs.cat(path)[: size // 2])
    path, size = _largest(fs, 16)  # 2. bytes flipped in place: same size, other content
    data = bytearray(fs.cat(path))
    for i in range(0, len(data), max(1, len(data) // 5)):
        data[i] ^= 0xFF
    fs.pipe(path, bytes(data))
    deleted = sorted(k for k in _files(fs, 12) if k.startswith("meta/"))[0]  # 3. one file gone
    fs.rm(f"{CKPT}/12/{deleted}")
    fs.pipe(f"{CKPT}/8/{NAME}", b"")  # 4. the manifest emptied

    resumed = run_ok(spawn, base, tmp_path, "resumed", env=gcs_emulator)
    lines = [x for x in resumed.stderr.splitlines() if "is unreadable" in x]
    assert len(lines) == 4, resumed.stderr[-4000:]
    by_step = {int(x.split("checkpoint step ")[1].split()[0]): x for x in lines}
    assert set(by_step) == {20, 16, 12, 8}
    assert "bytes, the manifest says" in by_step[20]
    assert "CRC32C" in by_step[16] and "its bytes changed" in by_step[16]
    assert f"{deleted}: verification failed: missing" in by_step[12]
    assert f"{NAME}: verification failed" in by_step[8]
    assert all("restoring step 4 instead" in x and "moved aside to" in x for x in lines)
    events = [r for r in resumed.lines() if r.get("event") == "restored"]
    assert events[0]["step"] == 4 and 0 < events[0]["verify_s"] < events[0]["seconds"]
    assert summary(WD)["params_fingerprint"] == reference
    fs.invalidate_cache()
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(CKPT)}
    aside = sorted(n.split(".")[0] for n in names if ".unreadable-" in n)
    assert aside == ["12", "16", "20", "8"]  # set aside, never deleted


def test_another_process_counts_a_step_committed_only_once_its_manifest_is_there(
    gcs_emulator, monkeypatch
):
    """A worker must not report a step its restore would refuse. Orbax's commit is not enough:
    process 0's manifest must be there (a campaign once saw worker 1 report step 512 committed,
    and process 0 was killed before writing 512's manifest; the restore took 450)."""
    from localpod import storage as bucket
    from trainer import checkpoint
    from trainer.config import load_config

    monkeypatch.setattr(checkpoint.jax, "process_index", lambda: 1)
    checkpoints = checkpoint.Checkpoints(f"{WD}-unverified", load_config("tiny"), 1)
    checkpoints._commit(20)  # Orbax committed step 20 here; process 0 has not verified it yet
    assert checkpoints.poll() is None and checkpoints.poll() is None
    # process 0 writes the manifest (another process: straight to the bucket, not through the
    # gcsfs instance here, whose cached listing must not hide it)
    name = "runs/verify-unverified/checkpoints/20/" + NAME
    bucket.upload(
        gcs_emulator["STORAGE_EMULATOR_HOST"], "tpupod-test", name, b"{}", "application/json"
    )
    assert checkpoints.poll() == 20
