"""Token shards: the on-disk formats, the byte-level `prepare` of the default corpus, a shard
writer for `trainer.prepare`, and a verified load.

A shard directory holds `index.json` (format, per-shard token counts and sha256) and raw files
`shard-NNNNN.bin`, so preparing is deterministic and verifying is cheap. Two formats:
`tpupod-bytes-v1` (one uint8 token per byte; the default corpus) and `tpupod-tokens-v1` (little-
endian tokens of the narrowest dtype for the vocabulary, documents separated by the tokenizer's
end-of-text token, the tokenizer recorded in the index and copied beside the shards).
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
from trainer.tokenizer import OLD_BYTES_INFO, TokenizerInfo

FORMAT = "tpupod-bytes-v1"
TOKENS_FORMAT = "tpupod-tokens-v1"
FORMATS = (FORMAT, TOKENS_FORMAT)
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


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest little-endian unsigned dtype that holds every token id."""
    for dtype in ("u1", "<u2", "<u4"):
        if vocab_size <= np.iinfo(np.dtype(dtype)).max + 1:
            return np.dtype(dtype)
    raise BadInput(f"vocabulary of {vocab_size} tokens does not fit 32 bits")


class ShardWriter:
    """Appends token arrays and writes fixed-size shards of `tpupod-tokens-v1`; `finish` writes
    the index last, so a directory with an index is complete."""

    def __init__(self, out: str, tokenizer: TokenizerInfo, shard_bytes: int = SHARD_BYTES):
        self.out, self.tokenizer = out, tokenizer
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.shard_tokens = max(1, shard_bytes // self.dtype.itemsize)
        self.shards: list[dict] = []
        self.tokens = 0
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0

    def add(self, tokens: np.ndarray) -> None:
        self._pending.append(np.asarray(tokens, dtype=self.dtype))
        self._pending_tokens += len(tokens)
        while self._pending_tokens >= self.shard_tokens:
            flat = np.concatenate(self._pending)
            self._write(flat[: self.shard_tokens])
            rest = flat[self.shard_tokens :]
            self._pending, self._pending_tokens = [rest], len(rest)

    @property
    def added(self) -> int:
        return self.tokens + self._pending_tokens

    def _write(self, tokens: np.ndarray) -> None:
        data = tokens.tobytes()
        name = f"shard-{len(self.shards):05d}.bin"
        storage.write_bytes(storage.join(self.out, name), data)
        digest = hashlib.sha256(data).hexdigest()
        self.shards.append({"name": name, "tokens": len(tokens), "sha256": digest})
        self.tokens += len(tokens)

    def finish(self, **extra) -> dict:
        if self._pending_tokens:
            self._write(np.concatenate(self._pending))
            self._pending, self._pending_tokens = [], 0
        index = {
            "format": TOKENS_FORMAT,
            "dtype": self.dtype.str,
            "vocab_size": self.tokenizer.vocab_size,
            "tokenizer": self.tokenizer.to_json(),
            "shards": self.shards,
            "tokens": self.tokens,
            **extra,
        }
        storage.write_bytes(
            storage.join(self.out, "index.json"), json.dumps(index, indent=1).encode()
        )
        return index


def read_index(uri: str) -> dict:
    try:
        index = json.loads(storage.read_bytes(storage.join(uri, "index.json")))
    except FileNotFoundError:
        raise BadInput(
            f"data {uri}: no index.json (prepare it with python -m trainer.data prepare)"
        ) from None
    except (ValueError, UnicodeDecodeError):
        raise BadInput(f"data {uri}: index.json is corrupt") from None
    if not isinstance(index, dict) or index.get("format") not in FORMATS:
        raise BadInput(f"data {uri}: not a tpupod shard directory ({' or '.join(FORMATS)})")
    return index


def tokenizer_info(index: dict) -> TokenizerInfo:
    if index["format"] == FORMAT:
        return OLD_BYTES_INFO
    return TokenizerInfo.from_json(index["tokenizer"])


def load(uri: str) -> tuple[np.ndarray, TokenizerInfo]:
    """All tokens of a shard directory as one array (every shard verified), and its tokenizer."""
    index = read_index(uri)
    dtype = np.dtype(index.get("dtype", "u1"))
    chunks = []
    for shard in index["shards"]:
        try:
            data = storage.read_bytes(storage.join(uri, shard["name"]))
        except FileNotFoundError:
            raise BadInput(f"data {uri}: shard {shard['name']} is missing") from None
        size = shard["tokens"] * dtype.itemsize
        if len(data) != size or hashlib.sha256(data).hexdigest() != shard["sha256"]:
            raise BadInput(
                f"data {uri}: shard {shard['name']} is corrupt (size or sha256 mismatch); "
                "prepare the data again"
            )
        chunks.append(np.frombuffer(data, dtype=dtype))
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype)
    return tokens, tokenizer_info(index)


def synthetic_tokens(seed: int, n: int = 1 << 16) -> np.ndarray:
    """For tests only: a seeded random byte stream with a learnable (repeating) structure."""
    period = np.random.default_rng(seed).integers(0, 256, size=997, dtype=np.uint8)
    return np.resize(period, n)
