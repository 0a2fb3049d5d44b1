"""The checkpoint format is explicit config (default OCDBT, never inferred from the environment),
and an unreadable step's error becomes one line naming its file."""

from __future__ import annotations

import pytest

from trainer.config import BadInput, load_config
from trainer.restore import describe, unreadable_cause


def test_format_is_config_default_ocdbt_whatever_the_environment(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    assert load_config("tiny").checkpoint_format == "ocdbt"
    assert load_config("tiny", ["checkpoint_format=plain"]).checkpoint_format == "plain"
    with pytest.raises(BadInput, match="checkpoint_format='zarr': use one of ocdbt, plain"):
        load_config("tiny", ["checkpoint_format=zarr"])


def test_describe_names_the_file_and_what_was_wrong():
    step = "gs://b/runs/x/checkpoints/12"
    gcs = ValueError(f'OUT_OF_RANGE: Error reading "params.head.kernel/0.0" in OCDBT database at '
                     f"{step}/state/: Requested byte range [0, 9) was not satisfied")  # fmt: skip
    assert describe(step, gcs) == (
        "state/ (OCDBT key params.head.kernel/0.0)",
        "Requested byte range [0, 9) was not satisfied",
    )
    local = ValueError('Error reading "a/0.0" in OCDBT database at local file "/w/c/12/state/": '
                       "value of size 1000")  # fmt: skip
    assert describe("/w/c/12", local) == ("state/ (OCDBT key a/0.0)", "value of size 1000")
    assert describe(step, KeyError("Unknown key: state. Available keys: ['data']")) == (
        "state/",
        "missing",
    )
    gone = FileNotFoundError(f"{step}/data/process_0-of-1.json")
    assert describe(step, gone)[0] == "data/process_0-of-1.json"


def test_only_storage_errors_count_as_unreadable():
    try:
        try:
            raise ValueError("Error reading ...")
        except ValueError as inner:
            raise Exception("Encountered error while reading array index") from inner
    except Exception as wrapped:  # noqa: BLE001 - Orbax's own wrapping, as it raises it
        assert isinstance(unreadable_cause(wrapped), ValueError)
    assert unreadable_cause(RuntimeError("XLA out of memory")) is None
