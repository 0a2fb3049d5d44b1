"""The benchmarks' and demo's reader of a run's summary.json goes through the bucket's storage
faults as a GCS client does: a campaign leg under 5 % bucket errors once lost its final
fingerprint to one dropped GET."""

from __future__ import annotations

import json
import urllib.request

from demo.reference import read_object
from localpod.gcp import storage, storage_faults


def _faults(url: str, plan: dict | None = None) -> dict:
    """GET (or, with a plan, POST: counts start again) the emulator's fault control endpoint."""
    data = json.dumps(plan).encode() if plan is not None else None
    request = urllib.request.Request(url + storage_faults.CONTROL_PATH, data)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def test_an_object_is_read_through_a_bucket_failing_half_its_requests(tmp_path):
    with storage.running_emulator("tpupod-read") as url:
        (tmp_path / "endpoints.json").write_text(
            json.dumps({"storage": url, "bucket": "tpupod-read"})
        )
        storage.upload(
            url, "tpupod-read", "runs/a/summary.json", b'{"final_step": 7}', "application/json"
        )
        _faults(url, {"rate": 0.5, "kinds": ["429", "503", "drop"], "seed": 3})
        once = [read_object(tmp_path, "runs/a/summary.json", attempts=1) for _ in range(12)]
        retried = [read_object(tmp_path, "runs/a/summary.json") for _ in range(12)]
        missing = read_object(tmp_path, "runs/a/nothing.json")
        report = _faults(url)
    assert None in once  # negative control: without retries the faults hide the object
    assert retried == [{"final_step": 7}] * 12
    assert missing is None
    assert all(report["injected"][k] >= 1 for k in ("429", "503", "drop")), report
