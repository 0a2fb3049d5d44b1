"""Checksums of a checkpoint step, written as part of its save and checked before it is
restored: a step whose files changed, shrank, vanished or multiplied since is never restored.

`<step>/tpupod-manifest.json` lists every file of the step (its items state, data and meta, and
Orbax's item metadata) with its size and CRC32C. It is written once every item has finished and
before Orbax's commit (trainer/checkpoint.py), so it leaves out the two files Orbax writes at the
commit itself: `commit_success.txt` and `_CHECKPOINT_METADATA` (commit time stamped); a damaged
one of those is caught only by Orbax failing to read it. On GCS the CRC32C is the one the store
computed when the object was written, read from a listing (a manifest costs one listing, not a
read of the checkpoint); on a local disk it is computed from the bytes. Verifying lists again
and compares: bytes rewritten (another CRC32C), a file truncated, deleted or added, or a
manifest unreadable or empty, all fail the step. Why a manifest rather than a checksum codec in
the array store: it covers every item (the data iterator's files, the JSON metadata), not only
the arrays, and on GCS it reads nothing the restore does not read anyway.

A run from before manifests (none of its steps has one) is restored as before; once a run has
manifests, a committed step without one counts as unverified and is not restored (trainers
before the pre-commit manifest wrote it after the commit, and a kill could fall in between).
"""

from __future__ import annotations

import base64
import json

import google_crc32c

from contract.checkpoint_manifest import (
    COMMIT_FILES,
    FORMAT,
    NAME,
    differences,
)
from trainer import storage


def _crc32c(data: bytes) -> str:
    """As GCS spells it: base64 of the big-endian 4 bytes."""
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


def listing(step_dir: str) -> dict[str, list]:
    """Relative path -> [size, CRC32C] of every file of the step but the manifest and Orbax's
    commit files."""
    fs = storage.fs(step_dir)
    if storage.is_remote(step_dir):
        fs.invalidate_cache(step_dir)  # written by tensorstore, not through this filesystem
    found = fs.find(step_dir, detail=True)
    base = fs._strip_protocol(step_dir).rstrip("/") + "/"
    files = {}
    for path, info in found.items():
        rel = path.removeprefix(base)
        if rel == NAME or rel in COMMIT_FILES or info.get("type") == "directory":
            continue
        crc = info.get("crc32c") if storage.is_remote(step_dir) else None
        if crc is None:
            with fs.open(path, "rb") as f:
                crc = _crc32c(f.read())
        files[rel] = [int(info["size"]), crc]
    return files


def write(step_dir: str, step: int) -> None:
    """The step's manifest, from what it holds now (call once its items have finished)."""
    doc = {"format": FORMAT, "step": step, "files": listing(step_dir)}
    storage.write_bytes(storage.join(step_dir, NAME), json.dumps(doc, sort_keys=True).encode())


def read(step_dir: str) -> dict | None:
    """The step's manifest; None when it has none; {} when it is unreadable."""
    uri = storage.join(step_dir, NAME)
    try:
        raw = storage.read_bytes(uri)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def check(step_dir: str, run_has_manifests: bool) -> tuple[str, str] | None:
    """None when the step is verified (or a run from before manifests), else (file, reason)."""
    manifest = read(step_dir)
    if manifest is None:
        if not run_has_manifests:
            return None
        return NAME, "missing: the step committed but was never verified"
    problem = differences(manifest, listing(step_dir))
    if problem is None:
        return None
    file, _, reason = problem.partition(": ")
    return file, f"verification failed: {reason}"


def any_in(directory: str, steps: list[int]) -> bool:
    """Some step of the run has a manifest (a run from after manifests)."""
    return any(storage.exists(storage.join(directory, str(s), NAME)) for s in steps)
