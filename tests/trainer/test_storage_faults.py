"""Storage as real GCS behaves under load (localpod.gcp.storage_faults): 429s, 503s and dropped
connections on 5 % of requests for a whole run (data, checkpoints, compile cache, all on gs://)
end bitwise equal to the uninterrupted run; a save that cannot commit leaves the previous
committed step readable; a bucket that stays unreachable fails the trainer in one line, well
under 30 s."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from trainer_testlib import free_port, gcs_env, run_ok, summary

from localpod.gcp import storage_faults
from trainer import storage

STEPS = 200  # tiny steps take ~30 ms: the run must outlast the first save under faults
EVERY = 4
FIVE_PERCENT = {"rate": 0.05, "kinds": ["429", "503", "drop"], "seed": 7}


def _faults(env: dict, plan: dict | None = None) -> dict:
    """GET (or, with a plan, POST) the emulator's fault control endpoint."""
    url = env["STORAGE_EMULATOR_HOST"] + storage_faults.CONTROL_PATH
    data = json.dumps(plan).encode() if plan is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
        return json.loads(resp.read())


def _verified_steps(run: str) -> list[int]:
    import gcsfs

    fs = gcsfs.GCSFileSystem()
    fs.invalidate_cache()
    found = fs.glob(f"{run}/checkpoints/*/tpupod-manifest.json")
    return sorted(int(p.split("/")[-2]) for p in found)


def _add(total: dict, report: dict) -> None:
    for kind, n in report["injected"].items():
        total[kind] = total.get(kind, 0) + n


# slow: minutes of a faulted run and its reference; the faults' own paths (unreachable, 503-only,
# the plan) stay in CI, and CI stays under 20 minutes on 2 cores.
@pytest.mark.slow
def test_five_percent_faults_and_a_save_that_cannot_commit_end_bitwise_equal(
    spawn, tmp_path, gcs_emulator
):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("".join(f"line {i} of the tpupod corpus\n" for i in range(400)))
    from trainer.data import main as data_main

    assert data_main(["prepare", "--source", str(src), "--out", "gs://tpupod-test/data"]) == 0
    base = ["--config", "tiny", "--steps", STEPS, "--set", f"checkpoint_every={EVERY}",
            "--set", "data=gs://tpupod-test/data",  # read under faults too
            "--compile-cache", "gs://tpupod-test/compile-cache"]  # fmt: skip
    run_ok(spawn, [*base, "--workdir", tmp_path / "ref"], tmp_path, "ref", env=gcs_emulator)
    reference = summary(tmp_path / "ref")["params_fingerprint"]
    run, injected = "gs://tpupod-test/runs/faults", {}

    # 5 % of requests fail from the first one; once a step is verified, every request fails.
    _faults(gcs_emulator, FIVE_PERCENT)
    first = spawn([*base, "--workdir", run], tmp_path, "faulted-1", env=gcs_emulator)
    first.wait_for(lambda: _verified_steps(run), timeout=240, what="a verified step")
    _add(injected, _faults(gcs_emulator, {"rate": 1.0, "kinds": ["503"]}))
    deadline = time.monotonic() + 60
    while _faults(gcs_emulator)["injected"]["503"] < 10 and time.monotonic() < deadline:
        time.sleep(0.2)
    first.kill()  # SIGKILL while its saves fail
    _add(injected, _faults(gcs_emulator, {"rate": 0.0}))
    committed = max(_verified_steps(run))
    assert first.last_step() >= committed + EVERY, "no save was due after the last commit"

    _faults(gcs_emulator, {**FIVE_PERCENT, "seed": 8})
    second = run_ok(spawn, [*base, "--workdir", run], tmp_path, "faulted-2", env=gcs_emulator)
    _add(injected, _faults(gcs_emulator))
    restored = [r for r in second.lines() if r.get("event") in ("restored", "checkpoint_fallback")]
    assert [(r["event"], r["step"]) for r in restored] == [("restored", committed)]
    done = summary(run)
    assert done["final_step"] == STEPS and done["params_fingerprint"] == reference
    assert all(injected[k] >= 1 for k in ("429", "503", "drop")), injected  # the faults landed


def test_a_bucket_that_stays_unreachable_fails_in_one_line(spawn, tmp_path):
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    args = ["--config", "tiny", "--workdir", "gs://tpupod-gone/runs/a"]
    t = run_ok(spawn, args, tmp_path, "unreachable", env=gcs_env(port), code=1)
    # the probe's 20 s deadline plus a loaded machine's start-up; gcsfs's own retries take 84 s
    assert time.monotonic() - t0 < 60
    lines = [x for x in t.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, t.stderr[-3000:]
    assert lines[0].startswith("error: workdir gs://tpupod-gone/runs/a: bucket tpupod-gone")
    assert f"127.0.0.1:{port}" in lines[0] and "Cannot connect" in lines[0]


def test_a_bucket_answering_only_503_is_unreachable_and_names_the_cause(gcs_emulator):
    _faults(gcs_emulator, {"rate": 1.0, "kinds": ["503"]})
    with pytest.raises(storage.Unreachable, match=r"bucket tpupod-test unreachable .*503"):
        storage.check_writable("gs://tpupod-test/runs/b", 0, timeout=3)
    tried = _faults(gcs_emulator)["injected"]["503"]
    assert tried >= 1
    # Nothing goes on retrying past the deadline: a probe left running read STORAGE_EMULATOR_HOST
    # at every try and, once the test put the environment back, asked storage.googleapis.com.
    time.sleep(5)  # gcsfs backs off 1, 2, 4 s between tries
    assert _faults(gcs_emulator)["injected"]["503"] == tried


def test_the_fault_plan_is_checked_and_seeded(gcs_emulator):
    url = gcs_emulator["STORAGE_EMULATOR_HOST"] + storage_faults.CONTROL_PATH
    bad = urllib.request.Request(url, data=json.dumps({"rate": 2}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(bad, timeout=10)
    assert refused.value.code == 400
    gate = storage_faults.FaultGate(storage_faults.FaultPlan(rate=0.3, seed=1))
    draws = [gate.draw() for _ in range(200)]
    again = storage_faults.FaultGate(storage_faults.FaultPlan(rate=0.3, seed=1))
    assert draws == [again.draw() for _ in range(200)]
    assert 30 <= sum(d is not None for d in draws) <= 90 and set(draws) - {None} == {
        "429", "503", "drop"}  # fmt: skip
