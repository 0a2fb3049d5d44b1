"""The local GCS emulator keeps GCS's generation preconditions, checked with Google's clients:
tensorstore's own GCS driver (the one OCDBT commits through) and google-cloud-storage."""

from __future__ import annotations

import pytest
import tensorstore as ts
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage


def test_tensorstore_conditional_writes_and_ocdbt(gcs_emulator):
    kv = ts.KvStore.open({"driver": "gcs", "bucket": "tpupod-test", "path": "gen/"}).result()
    absent = kv.read("x").result()
    assert absent.state == "missing"
    created = kv.write("x", b"one", if_equal=absent.stamp.generation).result()
    assert created.generation  # create-only (ifGenerationMatch=0) on a new name: written
    assert not kv.write("x", b"two", if_equal=absent.stamp.generation).result().generation
    read = kv.read("x").result()
    assert read.value == b"one" and read.stamp.generation == created.generation
    updated = kv.write("x", b"three", if_equal=created.generation).result()
    assert updated.generation and updated.generation != created.generation
    assert not kv.write("x", b"four", if_equal=created.generation).result().generation  # stale
    assert kv.read("x").result().value == b"three"

    spec = {"driver": "ocdbt", "base": {"driver": "gcs", "bucket": "tpupod-test", "path": "db/"}}
    db = ts.KvStore.open(spec).result()
    for i in range(3):
        db.write(f"k{i}", f"v{i}".encode()).result()
    again = ts.KvStore.open(spec).result()
    assert again.list().result() == [b"k0", b"k1", b"k2"]
    assert again.read("k1").result().value == b"v1"


def test_google_cloud_storage_preconditions(gcs_emulator):
    client = storage.Client(project="tpupod-test", credentials=AnonymousCredentials())
    blob = client.bucket("tpupod-test").blob("pre/a")
    blob.upload_from_string(b"one", if_generation_match=0)
    with pytest.raises(exceptions.PreconditionFailed):
        blob.upload_from_string(b"two", if_generation_match=0)
    blob.reload()
    generation = blob.generation
    blob.upload_from_string(b"three", if_generation_match=generation)
    with pytest.raises(exceptions.PreconditionFailed):
        blob.upload_from_string(b"four", if_generation_match=generation)
    with pytest.raises(exceptions.PreconditionFailed):
        blob.delete(if_generation_match=generation)
    assert blob.download_as_bytes() == b"three"


def test_the_emulator_takes_only_the_cpu_the_trainers_leave(gcs_emulator):
    """GCS's CPU is not the TPU host's: the emulator (this test's own child) runs niced."""
    import os
    from pathlib import Path

    from localpod.emulator import NICENESS

    def emulator_child(pid: str) -> bool:
        try:  # any other process may exit while we look
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            return (
                parent == os.getpid()
                and b"localpod.emulator" in Path(f"/proc/{pid}/cmdline").read_bytes()
            )
        except (OSError, ValueError, IndexError):
            return False

    ours = [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and emulator_child(pid)]
    assert len(ours) == 1, ours
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, ours[0]) == min(mine + NICENESS, 19)
