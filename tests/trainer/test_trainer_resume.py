"""Exact resume on one process: SIGTERM (exit 75, preemption save) and SIGKILL mid-save (resume
from the last committed step) both end bitwise identical to an uninterrupted run."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_testlib import REPO, run_ok, summary, trainer_env

from trainer.status import read_status

STEPS = 40


def _committed(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())


def _temporary(ckpt: Path) -> list[str]:
    return [p.name for p in ckpt.iterdir() if not p.name.isdigit() and "tmp" in p.name]


@pytest.mark.slow  # in CI: SIGKILL + bitwise resume (test_storage_faults), SIGTERM resume (test_data_train)
def test_resume_after_sigterm_and_sigkill(spawn, tmp_path):
    base = ["--config", "tiny", "--steps", STEPS]
    run_ok(spawn, [*base, "--workdir", tmp_path / "ref"], tmp_path, "ref")
    reference = summary(tmp_path / "ref")["params_fingerprint"]

    # 1. SIGTERM (twice) at a random step: preemption save, status `preempted`, exit 75.
    wd, status_file = tmp_path / "term", tmp_path / "term.status"
    args = [*base, "--workdir", wd, "--status-file", status_file]
    t = spawn(args, tmp_path, "term1")
    t.wait_for(lambda: any(r.get("event") == "initialised" for r in t.lines()), what="init")
    init = next(r for r in t.lines() if r.get("event") == "initialised")
    assert init["compile_cache_hit"] is True, init  # the ref run's init program, loaded
    k = random.randint(2, 12)
    t.wait_for(lambda: t.last_step() >= k, what=f"step {k}")
    t.signal(signal.SIGTERM)
    sent = time.time()
    time.sleep(0.05)
    t.signal(signal.SIGTERM)  # a second SIGTERM during the save changes nothing
    assert t.wait() == 75, t.stderr
    print(f"SIGTERM -> committed exit: {time.time() - sent:.2f}s")
    status = read_status(status_file)
    assert status.state == "preempted" and status.exit_code == 75
    stopped = status.step
    assert k <= stopped < STEPS and status.last_checkpoint == stopped
    assert _committed(wd / "checkpoints")[-1] == stopped

    again = run_ok(spawn, args, tmp_path, "term2")
    status = read_status(status_file)
    assert status.state == "done" and status.restored_from == stopped
    assert status.compile_cache_hit is True  # a restart does not recompile
    assert any(r.get("event") == "restored" and r["step"] == stopped for r in again.lines())
    assert summary(wd)["params_fingerprint"] == reference

    # 2. SIGKILL while an async save is being written, until one lands mid-write.
    wd = tmp_path / "kill"
    args = [*base, "--workdir", wd, "--set", "checkpoint_every=3"]
    ckpt = wd / "checkpoints"
    cut = None
    for attempt in range(6):
        t = spawn(args, tmp_path, f"kill{attempt}")
        t.wait_for(lambda: ckpt.exists() and bool(_temporary(ckpt)), what="an in-flight save")
        t.kill()
        if _temporary(ckpt):
            cut = _temporary(ckpt)
            break
    assert cut, "no kill landed during a save"
    before = _committed(ckpt)
    cut_step = int(cut[0].split(".")[0])
    assert cut_step not in before
    last = run_ok(spawn, args, tmp_path, "kill-final")
    restored = (
        next(r["step"] for r in last.lines() if r.get("event") == "restored") if before else None
    )
    assert restored == (before[-1] if before else None)
    assert not _temporary(ckpt), "leftover temporary directories are cleaned"
    assert summary(wd)["params_fingerprint"] == reference

    # 3. A config whose shapes differ from the checkpoint: one line, exit 2, checkpoint untouched.
    listing = sorted(p.name for p in ckpt.iterdir())
    bad = spawn([*args, "--set", "d_model=128"], tmp_path, "shapes")
    assert bad.wait() == 2
    assert "model shapes" in bad.stderr.strip().splitlines()[-1]
    assert "Traceback" not in bad.stderr
    assert sorted(p.name for p in ckpt.iterdir()) == listing


@pytest.mark.slow  # retention is unchanged by recovery work; CI stays under 20 minutes
def test_retention_keeps_the_latest_and_every_mth_step(spawn, tmp_path):
    """Old steps are pruned on a background thread; by the exit only the kept ones are left.
    Synchronous saves keep every save on the 2-step grid (async ones that cannot keep up are
    coalesced to later steps, except the keep_every steps: tests/bench/test_save_deferral.py)."""
    wd = tmp_path / "keep"
    sets = ["checkpoint_every=2", "keep_latest=2", "keep_every=4", "checkpoint_async=false"]
    args = ["--config", "tiny", "--steps", 12, "--workdir", wd]
    run_ok(spawn, [*args, *(x for s in sets for x in ("--set", s))], tmp_path, "keep")
    assert _committed(wd / "checkpoints") == [4, 8, 10, 12]
    assert not _temporary(wd / "checkpoints")


# Another trainer version: the same config, but the MLP input kernel is named `gate_up`.
OTHER_VERSION = """
import sys
import trainer.model as model
from trainer.cli import main
dense = model._dense
model._dense = lambda *a: dense(*a[:-1], {"wi": "gate_up"}.get(a[-1], a[-1]))
sys.exit(main())
"""


def test_a_checkpoint_of_another_parameter_tree_is_refused_in_one_line(spawn, tmp_path):
    """The config shapes match, the parameter names do not: refused before Orbax sees it (whose
    tree-mismatch error would be a traceback), with the checkpoint left as it was."""
    wd = tmp_path / "other"
    args = ["--config", "tiny", "--steps", "6", "--workdir", str(wd)]
    old = subprocess.run([sys.executable, "-c", OTHER_VERSION, *args], cwd=REPO,
                         env=trainer_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert old.returncode == 0, old.stderr[-3000:]
    ckpt = wd / "checkpoints"
    assert _committed(ckpt) == [5, 6]
    listing = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*"))
    bad = spawn([*args[:-3], 10, "--workdir", wd], tmp_path, "resume")
    assert bad.wait() == 2
    last = bad.stderr.strip().splitlines()[-1]
    assert "checkpoint step 6" in last, last
    assert "has params/block_0/gate_up/kernel" in last and "lacks params/block_0/wi/kernel" in last
    assert "another trainer version" in last and "new --workdir" in last
    assert "Traceback" not in bad.stderr
    assert sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*")) == listing
