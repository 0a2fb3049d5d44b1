"""A failing phase is named, with its reason, in bootstrap.json and bootstrap.log."""

from __future__ import annotations

import json


def failed(single) -> dict:
    boot = single.bootstrap(0)
    assert boot["state"] == "failed"
    assert boot["phases"][-1]["name"] == boot["phase"]
    assert boot["phases"][-1]["state"] == "failed"
    assert boot["phases"][-1]["message"] == boot["message"]
    return boot


def test_missing_bucket_key_names_the_metadata_phase(single, bundles):
    single.publish(bundles[0], tpupod_bucket=None)
    (result,) = single.boot()
    assert result.returncode != 0
    boot = failed(single)
    assert boot["phase"] == "metadata"
    assert "tpupod-bucket" in boot["message"]
    log = (single.root(0) / "bootstrap.log").read_text()
    assert "[metadata] FAILED: metadata key tpupod-bucket is missing" in log
    assert "[uv]" not in log
    assert not (single.root(0) / "job.env").exists()


def test_bundle_hash_mismatch_is_refused(single, bundles):
    wrong = "0" * 64
    single.publish(bundles[0], tpupod_bundle_sha256=wrong)
    (result,) = single.boot()
    assert result.returncode != 0
    boot = failed(single)
    assert boot["phase"] == "bundle" and "sha256 mismatch" in boot["message"]
    bundles_dir = single.root(0) / "bundles"
    assert list(bundles_dir.iterdir()) == []  # nothing half-extracted left behind
    assert not (single.root(0) / "current").exists()


def test_phase_deadline_names_the_phase(single, bundles):
    single.publish(bundles[0])
    # A metadata server that never answers: the phase retries until its deadline.
    closed = "127.0.0.1:9"
    (result,) = single.boot(GCE_METADATA_HOST=closed, TPUPOD_DEADLINE_METADATA="3")
    assert result.returncode != 0
    boot = failed(single)
    assert boot["phase"] == "metadata" and boot["message"] == "deadline of 3s exceeded"
    assert json.loads((single.root(0) / "bootstrap.json").read_text())["phases"][0]["seconds"] >= 3


def test_a_worker_without_an_index_names_both_keys(single, bundles):
    """The worker's index comes from agent-worker-number (a TPU API node) or worker-id (a
    Compute Engine TPU VM): with neither, the metadata phase fails naming both."""
    single.publish(bundles[0], agent_worker_number=None)
    (result,) = single.boot()
    assert result.returncode != 0
    boot = failed(single)
    assert boot["phase"] == "metadata"
    assert boot["message"] == "metadata keys agent-worker-number and worker-id are both missing"
