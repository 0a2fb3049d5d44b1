"""Byte-level token shards: the on-disk format, `prepare` and a verified load.

A shard directory holds `index.json` (format, per-shard token counts and sha256) and raw uint8
files `shard-NNNNN.bin`: one token per byte, so preparing is deterministic and verifying is cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from trainer import storage
from trainer.config import BadInput

FORMAT = "tpupod-bytes-v1"
SHARD_BYTES = 1 << 20
SEPARATOR = b"\n\x00\n"  # marks file boundaries in the token stream


def corpus_bytes(source: str, pattern: str = "**/*") -> bytes:
    """Concatenates the UTF-8 text files under `source`, sorted by relative path."""
    root = Path(source)
    if not root.is_dir():
        raise BadInput(f"--source {source} is not a directory")
    parts = []
    for path in sorted(p for p in root.glob(pattern) if p.is_file()):
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        parts.append(data)
    if not parts:
        raise BadInput(f"--source {source}: no text files matching {pattern!r}")
    return SEPARATOR.join(parts)


def prepare(source: str, out: str, pattern: str = "**/*") -> dict:
    """Writes shards and index for the text files in `source`; returns the index."""
    data = corpus_bytes(source, pattern)
    shards = []
    for i, start in enumerate(range(0, len(data), SHARD_BYTES)):
        chunk = data[start : start + SHARD_BYTES]
        name = f"shard-{i:05d}.bin"
        storage.write_bytes(storage.join(out, name), chunk)
        shards.append(
            {"name": name, "tokens": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()}
        )
    index = {"format": FORMAT, "vocab_size": 256, "shards": shards, "tokens": len(data)}
    # The index goes last: a directory with an index is complete.
    storage.write_bytes(storage.join(out, "index.json"), json.dumps(index, indent=1).encode())
    return index


def default_corpus_source() -> str:
    """The standard library's own sources (the `os` module's directory): on every machine."""
    return os.path.dirname(os.__file__)


def default_corpus() -> str:
    """Prepares the default corpus into a local cache once (atomically) and returns its path."""
    source = default_corpus_source()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    key = hashlib.sha256(f"{FORMAT}:{source}".encode()).hexdigest()[:12]
    out = os.path.join(base, "tpupod", f"stdlib-{key}")
    if os.path.exists(os.path.join(out, "index.json")):
        return out
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".stdlib-", dir=os.path.dirname(out))
    prepare(source, tmp, "*.py")
    try:
        os.rename(tmp, out)
    except OSError:  # another process on this machine won the race: same bytes
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_tokens(uri: str) -> np.ndarray:
    """All tokens of a shard directory as one uint8 array, every shard verified."""
    try:
        index = json.loads(storage.read_bytes(storage.join(uri, "index.json")))
    except FileNotFoundError:
        raise BadInput(
            f"data {uri}: no index.json (prepare it with python -m trainer.data)"
        ) from None
    except (ValueError, UnicodeDecodeError):
        raise BadInput(f"data {uri}: index.json is corrupt") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise BadInput(f"data {uri}: not a {FORMAT} shard directory")
    chunks = []
    for shard in index["shards"]:
        try:
            data = storage.read_bytes(storage.join(uri, shard["name"]))
        except FileNotFoundError:
            raise BadInput(f"data {uri}: shard {shard['name']} is missing") from None
        if len(data) != shard["tokens"] or hashlib.sha256(data).hexdigest() != shard["sha256"]:
            raise BadInput(
                f"data {uri}: shard {shard['name']} is corrupt (size or sha256 mismatch)"
            )
        chunks.append(np.frombuffer(data, dtype=np.uint8))
    return np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)


def synthetic_tokens(seed: int, n: int = 1 << 16) -> np.ndarray:
    """For tests only: a seeded random byte stream with a learnable (repeating) structure."""
    period = np.random.default_rng(seed).integers(0, 256, size=997, dtype=np.uint8)
    return np.resize(period, n)
