"""Checkpoint compression is config (default off): the written arrays name their compressor, and
a step restores whatever it was written with, bitwise, in either direction."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from trainer_testlib import run_ok, summary

from trainer.config import load_config

# Plain format on local disk: every array's .zarray is a file, and a step directory is whole.
BASE = ["--config", "tiny", "--steps", 8, "--set", "checkpoint_every=4",
        "--set", "checkpoint_format=plain", "--set", "checkpoint_async=false"]  # fmt: skip
ON = ["--set", "checkpoint_compression=true"]


def compressors(step_dir: Path) -> set[str | None]:
    """The compressor ids of every array in a step (None: stored raw)."""
    found = set()
    for zarray in step_dir.glob("state/**/.zarray"):
        compressor = json.loads(zarray.read_text())["compressor"]
        found.add(compressor and compressor["id"])
    assert found, f"no arrays under {step_dir}/state"
    return found


def test_compression_is_config_and_off_by_default():
    assert load_config("tiny").checkpoint_compression is False
    assert load_config("small").checkpoint_compression is False
    assert load_config("tiny", ["checkpoint_compression=true"]).checkpoint_compression is True


@pytest.mark.slow  # a rarely changed config; CI stays under 20 minutes: `pytest -m slow`
def test_steps_restore_whatever_their_compression(spawn, tmp_path):
    ref = tmp_path / "ref"
    run_ok(spawn, [*BASE, *ON, "--workdir", ref], tmp_path, "ref")
    reference = summary(ref)["params_fingerprint"]
    assert compressors(ref / "checkpoints" / "4") == {"zstd"}

    # A compressed step resumed by a run that does not compress: its own step is raw.
    off = tmp_path / "off"
    shutil.copytree(ref / "checkpoints" / "4", off / "checkpoints" / "4")
    run_ok(spawn, [*BASE, "--workdir", off], tmp_path, "off")
    assert summary(off)["restored_from"] == 4
    assert compressors(off / "checkpoints" / "8") == {None}
    assert summary(off)["params_fingerprint"] == reference

    # And a raw step restored by a run that compresses.
    on = tmp_path / "on"
    shutil.copytree(off / "checkpoints" / "8", on / "checkpoints" / "8")
    run_ok(spawn, [*BASE, *ON, "--workdir", on], tmp_path, "on")
    assert summary(on)["restored_from"] == 8
    assert summary(on)["params_fingerprint"] == reference
