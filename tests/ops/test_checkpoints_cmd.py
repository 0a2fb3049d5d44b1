"""`tpupod checkpoints --stack local`: a real trainer writes steps to the pod's bucket (the GCS
emulator named by endpoints.json); one step is truncated, one was set aside by a fallback; the
command lists them all, says which is unreadable and where a restart resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from localpod.gcp.storage import running_emulator
from tests.ops.conftest import dummy_token

REPO = Path(__file__).resolve().parents[2]
BUCKET = "tpupod-local"
RUN = "runs/local/r1"  # the run the pod's node spec names


@pytest.fixture
def pod(tmp_path):
    """A pod directory whose endpoints.json names a live emulator and a node spec with the run's
    directory (nothing else of the pod)."""
    with running_emulator(BUCKET) as url:
        spec = {"node": {"metadata": {"tpupod-run-dir": f"gs://{BUCKET}/{RUN}"}}}
        (tmp_path / "node-spec.json").write_text(json.dumps(spec))
        (tmp_path / "endpoints.json").write_text(
            json.dumps(
                {
                    "storage": url,
                    "bucket": BUCKET,
                    "project": "tpupod-local",
                    "spec_file": str(tmp_path / "node-spec.json"),
                    "identities": {
                        "operator": {"email": "operator@example.com", "token_file": dummy_token()}
                    },
                }
            )  # fmt: skip
        )
        yield tmp_path, url


def _env(url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    env.update(JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore", NO_GCE_CHECK="true")
    return env


def _tpupod(*args: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops", *args], cwd=REPO, env=_env(url),
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_checkpoints_lists_steps_readability_resume_step_and_set_aside(pod, tmp_path):
    pod_dir, url = pod
    env = {**_env(url), "STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           "GOOGLE_AUTH_TOKEN_FOR_TESTING": "x", "FSSPEC_GCS_TOKEN": "anon",
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}  # fmt: skip
    train = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", "tiny", "--steps", "8",
         "--set", "checkpoint_every=3", "--set", "checkpoint_async=false",  # steps 3, 6, 8
         "--workdir", f"gs://{BUCKET}/{RUN}",
         "--compile-cache", str(tmp_path / "cc")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]

    client = storage.Client(project="p", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": url})  # fmt: skip
    bucket = client.bucket(BUCKET)
    base = f"{RUN}/checkpoints"
    step8 = {b.name: b for b in client.list_blobs(BUCKET, prefix=f"{base}/8/")}
    largest = max(step8.values(), key=lambda b: b.size)
    bucket.blob(largest.name).upload_from_string(largest.download_as_bytes()[: largest.size // 2])
    aside = "3.unreadable-20260101T000000Z"  # as the trainer's fallback names a step it set aside
    for blob in client.list_blobs(BUCKET, prefix=f"{base}/3/"):
        bucket.copy_blob(blob, bucket, blob.name.replace("/3/", f"/{aside}/", 1))

    out = _tpupod("checkpoints", "--stack", "local", "--pod-dir", str(pod_dir), "--json", url=url)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["resume_step"] == 6
    steps = {s["name"]: s for s in report["steps"]}
    assert set(steps) == {"3", "6", "8", aside}
    assert steps["3"]["readable"] and steps["6"]["readable"]
    assert steps["3"]["verified"] and steps["6"]["verified"]  # their manifests match
    assert steps["8"]["readable"] is False and steps["8"]["verified"] is False
    assert f"{largest.name.split('/8/', 1)[1]}: verification failed:" in steps["8"]["problem"]
    assert steps[aside]["set_aside"] and steps[aside]["step"] == 3
    for name in ("3", "6", "8"):
        s = steps[name]
        assert s["committed"] and s["format"] == "ocdbt" and s["size"] > 0 and s["time"]

    table = _tpupod("checkpoints", "--stack", "local", "--pod-dir", str(pod_dir), url=url)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "a restart resumes from step 6" in table.stdout
    assert "step 8 not verified: " in table.stdout and "verification failed" in table.stdout
    assert f"step 3 set aside by a fallback: {aside}" in table.stdout
    verify = _tpupod("checkpoints", "--stack", "local", "--pod-dir", str(pod_dir), "--verify",
                     "--structure-only", url=url)  # fmt: skip
    assert verify.returncode == 1, verify.stderr[-3000:]
    assert "verified and readable: 3, 6; failing: 8" in verify.stdout


def test_checkpoints_errors_are_one_line(tmp_path):
    none = _tpupod("checkpoints", "--stack", "local", "--pod-dir", str(tmp_path), url="")
    assert none.returncode == 2
    assert (
        none.stderr.strip() == f"tpupod: no local pod is up in {tmp_path} (run `tpupod local up`)"
    )
    gcp = _tpupod("checkpoints", "--stack", "prod", url="")
    assert gcp.returncode == 2
    assert gcp.stderr.strip().startswith("tpupod: --stack prod: pass --workdir gs://BUCKET/PREFIX")
