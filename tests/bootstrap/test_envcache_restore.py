"""An environment archive is unpacked as it downloads (bootstrap/envcache.py), yet nothing of it
is used before the sha256 of every byte matches its manifest: a damaged archive, or one whose
manifest agrees with it but that does not unpack, is refused in one line (exit 4) and leaves the
destination as it was. Against the storage emulator and the local pod's metadata server (the
token), with the standard-library script the workers run."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.bundle_archive import PROJECT_ROOT
from localpod.gcp import storage
from localpod.procs import free_port
from localpod.vm.metadata_server import MetadataServer, MetadataStore

BUCKET, STACK, KEY = "tpupod-envs", "s", "0123456789abcdef01234567"
SCRIPT = PROJECT_ROOT / "bootstrap" / "envcache.py"


@pytest.fixture
def bucket():
    """(env for envcache.py, emulator URL): a bucket on 127.0.0.1 and a metadata server."""
    metadata = MetadataServer(["127.0.0.1"], free_port("127.0.0.1"), MetadataStore())
    metadata.start()
    try:
        with storage.running_emulator(BUCKET) as url:
            env = {**os.environ, "MD_BUCKET": BUCKET, "MD_STACK": STACK,
                   "STORAGE_EMULATOR_HOST": url, "GCE_METADATA_HOST": f"127.0.0.1:{metadata.port}"}  # fmt: skip
            yield env, url
    finally:
        metadata.stop()


def envcache(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), *args], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def published(env: dict, tmp_path: Path) -> Path:
    src = tmp_path / "cache"
    for i in range(200):  # enough to span many download chunks
        (src / f"pkg{i % 7}").mkdir(parents=True, exist_ok=True)
        (src / f"pkg{i % 7}" / f"f{i}").write_bytes(os.urandom(16_384))
    done = envcache(env, "publish", KEY, str(src))
    assert done.returncode == 0 and "published to" in done.stdout, done.stdout + done.stderr
    return src


def manifest(url: str) -> dict:
    return json.loads(storage.download(url, BUCKET, f"envs/{STACK}/{KEY}.json"))


def test_a_published_environment_restores_as_it_was(bucket, tmp_path):
    env, _ = bucket
    src = published(env, tmp_path)
    done = envcache(env, "restore", KEY, str(tmp_path / "restored"))
    assert done.returncode == 0 and "sha256 verified" in done.stdout, done.stdout + done.stderr
    assert tree(tmp_path / "restored") == tree(src)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".envcache.")] == []


@pytest.mark.parametrize("damage", ["zeroed", "cut"])
def test_a_damaged_archive_is_refused_by_its_sha256_and_nothing_changes(bucket, tmp_path, damage):
    env, url = bucket
    published(env, tmp_path)
    good = manifest(url)
    data = bytearray(storage.download(url, BUCKET, good["object"]))
    if damage == "zeroed":
        data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    else:
        data = data[: len(data) // 3]
    storage.upload(url, BUCKET, good["object"], bytes(data), "application/octet-stream")
    dest = tmp_path / "restored"
    (dest / "kept").mkdir(parents=True)
    (dest / "kept" / "file").write_text("the cache before")
    done = envcache(env, "restore", KEY, str(dest))
    assert done.returncode == 4, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    assert f"its manifest says {good['sha256'][:16]}" in line and "refused" in line
    assert tree(dest) == {"kept/file": b"the cache before"}  # the unpacked part was dropped


def test_an_archive_that_does_not_unpack_is_refused_in_one_line(bucket, tmp_path):
    """Its manifest agrees with it (a worker of the stack could write both): the sha256 passes,
    tar fails, and the line says so."""
    env, url = bucket
    published(env, tmp_path)
    good = manifest(url)
    junk = os.urandom(100_000)
    storage.upload(url, BUCKET, good["object"], junk, "application/octet-stream")
    agreeing = {**good, "sha256": hashlib.sha256(junk).hexdigest(), "bytes": len(junk)}
    storage.upload(url, BUCKET, f"envs/{STACK}/{KEY}.json", json.dumps(agreeing).encode(),
                   "application/json")  # fmt: skip
    done = envcache(env, "restore", KEY, str(tmp_path / "restored"))
    assert done.returncode == 4, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith(f"environment {KEY}: archive does not unpack: ")
    assert not (tmp_path / "restored").exists()
