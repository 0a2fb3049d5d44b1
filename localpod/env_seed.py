"""Environments carried from one local pod's bucket to the next, within one test session.

Workers install their packages from the bucket (bootstrap/envcache.py); each pod has a fresh,
in-memory bucket, so without this every test's first boot would build its environments from the
package index again. With `TPUPOD_LOCAL_ENV_SEED=DIR`, `up` plants DIR's objects in the new bucket
before the node is created, and `down` adds the environments this pod published that DIR lacks
(each manifest with the archive it names: archive first, manifest last, as a worker writes them).
Unset (the demo, the benchmarks), a pod's first boot builds from the index, as on GCP.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from localpod.gcp import storage

SEED_VAR = "TPUPOD_LOCAL_ENV_SEED"
PREFIX = "envs/"


def seed_dir() -> Path | None:
    value = os.environ.get(SEED_VAR)
    return Path(value) if value else None


def plant(url: str, bucket: str, stack: str | None = None, token: str | None = None) -> int:
    """Uploads every seed object (archives before manifests); returns how many. `stack`: under
    that stack's prefix (envs/STACK/), whichever stack's workers built them (the key is the
    environment's; the prefix is only whose workers may write it)."""
    root = seed_dir()
    if root is None or not (root / PREFIX).is_dir():
        return 0
    files = sorted((p for p in (root / PREFIX).rglob("*") if p.is_file() and p.suffix != ".tmp"),
                   key=lambda p: p.suffix == ".json")  # fmt: skip
    for path in files:
        name, data = path.relative_to(root).as_posix(), path.read_bytes()
        if stack is not None:
            built_by = PREFIX + name[len(PREFIX) :].split("/", 1)[0] + "/"
            name = PREFIX + f"{stack}/" + name[len(built_by) :]
            if path.suffix == ".json":
                manifest = json.loads(data)
                manifest["object"] = PREFIX + f"{stack}/" + manifest["object"][len(built_by) :]
                data = json.dumps(manifest).encode()
        kind = "application/json" if path.suffix == ".json" else "application/octet-stream"
        storage.upload(url, bucket, name, data, kind, token)
    return len(files)


def harvest(url: str, bucket: str, token: str | None = None) -> int:
    """Copies the pod's newly published environments into the seed; returns how many."""
    root = seed_dir()
    if root is None:
        return 0
    added = 0
    for obj in storage.list_objects(url, bucket, PREFIX, token):
        name = obj["name"]
        if not name.endswith(".json") or (root / name).exists():  # manifests only
            continue
        manifest = storage.download(url, bucket, name, token)
        archive = json.loads(manifest)["object"]
        _write(root / archive, storage.download(url, bucket, archive, token))
        _write(root / name, manifest)
        added += 1
    return added


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
