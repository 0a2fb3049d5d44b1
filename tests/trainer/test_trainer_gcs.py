"""The whole flow on a gs:// workdir (gcp-storage-emulator on 127.0.0.1): shards prepared to
gs://, training, SIGTERM -> exit 75, resume, and the compile cache beside the workdir."""

from __future__ import annotations

import signal

import pytest
from trainer_testlib import run_ok, summary

STEPS = 16


# CI runs the same path (data, workdir and compile cache on gs://, a restore) under storage faults
# in test_storage_faults.py; this fault-free run stays for `pytest -m slow`.
@pytest.mark.slow
def test_gcs_workdir_end_to_end(spawn, tmp_path, gcs_emulator):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("".join(f"line {i} of the tpupod corpus\n" for i in range(400)))
    from trainer.data import main as data_main

    assert data_main(["prepare", "--source", str(src), "--out", "gs://tpupod-test/data"]) == 0
    base = ["--config", "tiny", "--steps", STEPS, "--set", "data=gs://tpupod-test/data"]

    run_ok(spawn, [*base, "--workdir", tmp_path / "ref"], tmp_path, "ref", env=gcs_emulator)
    reference = summary(tmp_path / "ref")["params_fingerprint"]

    wd = "gs://tpupod-test/runs/a"
    t = spawn([*base, "--workdir", wd], tmp_path, "gs1", env=gcs_emulator)
    t.wait_for(lambda: t.last_step() >= 3, what="step 3")
    t.signal(signal.SIGTERM)
    assert t.wait() == 75, t.stderr[-4000:]
    stopped = next(r["step"] for r in t.lines() if r.get("event") == "preempted")

    again = run_ok(spawn, [*base, "--workdir", wd], tmp_path, "gs2", env=gcs_emulator)
    events = {r["event"]: r for r in again.lines() if "event" in r}
    assert events["restored"]["step"] == stopped
    assert events["compiled"]["compile_cache_hit"] is True
    done = summary(wd)
    assert done["final_step"] == STEPS and done["restored_from"] == stopped
    assert done["params_fingerprint"] == reference
