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
