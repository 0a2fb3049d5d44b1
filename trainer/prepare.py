"""`python -m trainer.data prepare`: text, JSON lines and Parquet (local or gs://) into token
shards (`tpupod-tokens-v1`, trainer.shards) with the tokenizer recorded and copied beside them.

Sources are read in the order given, each glob or directory sorted by path. A `.txt` file (or any
UTF-8 file found in a directory) is one document; a `.jsonl` / `.jsonl.gz` line and a `.parquet`
row are one document each, their text in `--text-field`. Empty documents are skipped, so the same
documents give the same token stream whatever files they came in. Every document is followed by
the tokenizer's end-of-text token. pyarrow is imported only for Parquet.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from trainer import shards, storage, tokenizer
from trainer.config import BadInput

BATCH_DOCUMENTS = 512  # documents per encode_batch call
UNREADABLE = (OSError, ValueError, EOFError, UnicodeDecodeError)


@dataclass(frozen=True)
class SourceFile:
    uri: str
    size: int
    from_directory: bool  # found by walking a directory: non-text files are skipped, not errors


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def expand(sources: list[str], pattern: str = "**/*") -> list[SourceFile]:
    """Files named by paths, globs and directories (each expanded in sorted order)."""
    found: list[SourceFile] = []
    for source in sources:
        fs, path = fsspec.core.url_to_fs(source)
        scheme = source.split("://", 1)[0] + "://" if storage.is_remote(source) else ""
        if _is_glob(source):
            names, walked = sorted(fs.glob(path)), False
        elif fs.isdir(path):
            names, walked = sorted(fs.glob(f"{path.rstrip('/')}/{pattern}")), True
        else:
            names, walked = [path], False
        files = [n for n in names if fs.isfile(n)]
        if not files:
            raise BadInput(f"--source {source}: no such file (or nothing matches)")
        for name in files:
            uri = f"{scheme}{name}" if scheme else name
            found.append(SourceFile(uri, int(fs.size(name) or 0), walked))
    return found


def _kind(uri: str) -> str:
    if uri.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    return "parquet" if uri.endswith(".parquet") else "text"


def _jsonl(src: SourceFile, field: str) -> Iterator[str]:
    with fsspec.open(src.uri, "rt", encoding="utf-8", compression="infer") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise BadInput(f"{src.uri} line {n}: not valid JSON") from None
            value = record.get(field) if isinstance(record, dict) else None
            if not isinstance(value, str):
                has = ", ".join(record) if isinstance(record, dict) else type(record).__name__
                what = "no" if value is None else f"a non-string ({type(value).__name__})"
                raise BadInput(
                    f"{src.uri} line {n}: {what} text field {field!r} (it has: {has}); "
                    "name the right one with --text-field"
                )
            yield value


def _parquet(src: SourceFile, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq  # lazy: only the machine that prepares data has pyarrow

    with fsspec.open(src.uri, "rb") as f:
        table = pq.ParquetFile(f)
        names = table.schema_arrow.names
        if field not in names:
            raise BadInput(
                f"{src.uri}: no text column {field!r} (columns: {', '.join(names)}); "
                "name the right one with --text-field"
            )
        for batch in table.iter_batches(columns=[field], batch_size=BATCH_DOCUMENTS):
            for value in batch.column(0).to_pylist():
                if value is not None and not isinstance(value, str):
                    raise BadInput(f"{src.uri}: column {field!r} is not text")
                yield value or ""


def _text(src: SourceFile) -> Iterator[str]:
    data = storage.read_bytes(src.uri)
    try:
        yield data.decode("utf-8")
    except UnicodeDecodeError:
        if not src.from_directory:
            raise BadInput(f"{src.uri}: not UTF-8 text") from None


def documents(src: SourceFile, field: str) -> Iterator[str]:
    """The non-empty documents of one file; one-line BadInput when it cannot be read."""
    readers = {"jsonl": lambda: _jsonl(src, field), "parquet": lambda: _parquet(src, field),
               "text": lambda: _text(src)}  # fmt: skip
    try:
        for doc in readers[_kind(src.uri)]():
            if doc:
                yield doc
    except BadInput:
        raise
    except UNREADABLE as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise BadInput(f"cannot read {src.uri}: {reason}") from None


def _batches(docs: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def prepare(
    sources: list[str],
    out: str,
    tokenizer_spec: str = tokenizer.BYTES,
    text_field: str = "text",
    pattern: str = "**/*",
) -> dict:
    """Tokenizes every document of `sources` into shards under `out`; returns the index."""
    tok = tokenizer.load(tokenizer_spec)
    files = expand(sources, pattern)
    if storage.exists(storage.join(out, "index.json")):
        raise BadInput(f"--out {out} already holds prepared data; remove it or pick another --out")
    writer = shards.ShardWriter(out, tok.info)
    eos = np.array([tok.info.eos_id], dtype=writer.dtype)
    count = 0
    console = Console(stderr=True)
    columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TimeRemainingColumn()]  # fmt: skip
    try:
        with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
            task = progress.add_task("preparing", total=sum(f.size for f in files))
            for src in files:
                for batch in _batches(documents(src, text_field), BATCH_DOCUMENTS):
                    for ids in tok.encode_batch(batch):
                        writer.add(np.asarray(ids, dtype=writer.dtype))
                        writer.add(eos)
                    count += len(batch)
                    progress.update(task, description=f"{count} documents, {writer.added} tokens")
                progress.advance(task, src.size)
        if count == 0:
            raise BadInput(
                f"--source {' '.join(sources)}: no documents ({len(files)} files, no text)"
            )
        if tok.raw is not None:
            storage.write_bytes(storage.join(out, tokenizer.FILE_NAME), tok.raw)
        return writer.finish(documents=count, text_field=text_field, sources=sources)
    except BaseException:
        _remove_written(out, writer)
        raise


def _remove_written(out: str, writer: shards.ShardWriter) -> None:
    """A failed prepare leaves nothing of its own behind (best effort)."""
    for shard in writer.shards:
        path = storage.join(out, shard["name"])
        with contextlib.suppress(OSError):
            storage.fs(path).rm(path) if storage.is_remote(path) else os.remove(path)


def default_sources() -> tuple[list[str], str]:
    """No --source: the standard library's own sources, as the default corpus."""
    return [shards.default_corpus_source()], "*.py"


def describe(index: dict, out: str) -> str:
    tok = index["tokenizer"]
    return (
        f"wrote {len(index['shards'])} shards, {index['tokens']} tokens "
        f"({index['documents']} documents, {np.dtype(index['dtype']).name}, "
        f"tokenizer {tok['kind']} vocab {tok['vocab_size']} eos {tok['eos_id']}) to {out}"
    )
