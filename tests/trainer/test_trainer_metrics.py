"""In-process units of the trainer's JSON-lines events and its cached peak probe (no training)."""

from __future__ import annotations

import json
import time

import jax.numpy as jnp
import pytest

from trainer import events, peak

PER_PROCESS = 1e11


def test_event_lines_carry_unix_time(capsys):
    before = time.time()
    events.event("compiled", seconds=1.5)
    line = capsys.readouterr().out
    assert line.startswith('{"event": "compiled", "time": ')  # readers grep the event name
    doc = json.loads(line)
    # `time` is rounded to the millisecond, so it may lead the clock by up to 0.5 ms.
    assert before - 0.001 <= doc["time"] <= time.time() + 0.001 and doc["seconds"] == 1.5
    start = events.process_start_time()
    assert start is None or 0 < time.time() - start < 7 * 86400


@pytest.fixture
def probe(monkeypatch, tmp_path):
    """An accelerator without a datasheet entry, a fake probe (its calls counted), a fresh cache."""
    calls = []
    monkeypatch.setattr(peak, "generation", lambda device: None)
    monkeypatch.setattr(peak, "measure_dot_peak", lambda dtype: calls.append(dtype) or PER_PROCESS)
    monkeypatch.setenv(peak.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(peak.FRESH_ENV, raising=False)
    return calls


def test_peak_is_cached_reused_and_refreshed_on_demand(probe, monkeypatch):
    assert peak.peak_flops(jnp.float32, measure=False) == (None, "")  # nothing cached yet
    flops, source = peak.peak_flops(jnp.float32)
    assert (flops, source, len(probe)) == (PER_PROCESS, peak.SOURCE, 1)
    assert peak.cache_key(jnp.float32) in json.loads(peak.cache_path().read_text())

    flops, source = peak.peak_flops(jnp.float32, measure=False)  # a restart: no probe
    assert flops == PER_PROCESS and source.startswith(f"{peak.SOURCE} (cached 20")
    assert len(probe) == 1
    assert peak.peak_flops(jnp.bfloat16, measure=False) == (None, "")  # another key

    monkeypatch.setenv(peak.FRESH_ENV, "1")
    assert peak.peak_flops(jnp.float32, measure=False) == (None, "")
    assert peak.peak_flops(jnp.float32) == (PER_PROCESS, peak.SOURCE) and len(probe) == 2


@pytest.mark.parametrize("where", ["local", "gs"])
def test_a_recreated_vm_reads_the_peak_beside_the_compile_cache(probe, monkeypatch, tmp_path,
                                                                 where, request):  # fmt: skip
    """A recreated VM's disk starts empty: the probe's figure comes from the copy beside the
    run's compile cache (its bucket), not from a second probe."""
    if where == "gs":
        request.getfixturevalue("gcs_emulator")
        shared = f"gs://tpupod-test/compile-cache/peak-{tmp_path.name}"
    else:
        shared = str(tmp_path / "bucket" / "compile-cache")
    assert peak.peak_flops(jnp.float32, shared=shared) == (PER_PROCESS, peak.SOURCE)
    monkeypatch.setenv(peak.CACHE_DIR_ENV, str(tmp_path / "new-disk"))  # the recreated VM
    flops, source = peak.peak_flops(jnp.float32, shared=shared)
    assert flops == PER_PROCESS and source.startswith(f"{peak.SOURCE} (cached 20")
    assert len(probe) == 1
    assert peak.cached(peak.cache_key(jnp.float32), peak.cache_path())  # now on its disk too
    # negative controls: without the shared copy, a new disk probes again; and so does a fresh
    # probe asked for, shared copy or not
    monkeypatch.setenv(peak.CACHE_DIR_ENV, str(tmp_path / "another-disk"))
    assert peak.peak_flops(jnp.float32) == (PER_PROCESS, peak.SOURCE) and len(probe) == 2
    monkeypatch.setenv(peak.FRESH_ENV, "1")
    assert peak.peak_flops(jnp.float32, shared=shared) == (PER_PROCESS, peak.SOURCE)
    assert len(probe) == 3


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"KEY": {"flops": "fast"}}'])
def test_unusable_peak_cache_means_a_fresh_probe(probe, content):
    path = peak.cache_path()
    path.parent.mkdir(parents=True)
    path.write_text(content.replace("KEY", peak.cache_key(jnp.float32)))
    assert peak.peak_flops(jnp.float32) == (PER_PROCESS, peak.SOURCE) and len(probe) == 1
    assert peak.cached(peak.cache_key(jnp.float32), path)["flops"] == PER_PROCESS  # rewritten


def test_unwritable_peak_cache_is_not_fatal(probe, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(peak.CACHE_DIR_ENV, str(tmp_path / "a-file"))
    assert peak.peak_flops(jnp.float32) == (PER_PROCESS, peak.SOURCE)


def test_real_probe_measures_flops():
    flops = peak.measure_dot_peak(jnp.float32, n=64, min_seconds=0.0, repeats=3)
    assert flops > 1e6
