"""`python -m trainer.data prepare` with a real BPE tokenizer (trained here with `tokenizers` on
the default corpus, in well under a second): the same documents as .txt, .jsonl + .jsonl.gz and
.parquet give identical token streams; bad input is one line, exit 2, nothing left behind."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from trainer_testlib import REPO

from trainer import shards
from trainer import tokenizer as tokenizers_mod
from trainer.data import main as data_main

DOCUMENTS = 40
VOCAB = 1000


def corpus_documents(start: int = 0, count: int = DOCUMENTS) -> list[str]:
    """Whole files of the default corpus (the stdlib's own sources), in path order."""
    files = sorted(Path(shards.default_corpus_source()).glob("*.py"))[start : start + count]
    return [p.read_text() for p in files]


def train_bpe(path: Path, documents: list[str], vocab: int = VOCAB) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(documents, trainer)
    tok.save(str(path))
    return path


def write_formats(root: Path, documents: list[str]) -> dict[str, list[str]]:
    """The same documents as txt files (a glob), two JSON-lines files (plain and gzip, with an
    extra field and a blank line) and one Parquet file of small row groups: --source values."""
    (root / "txt").mkdir(parents=True)
    for i, doc in enumerate(documents):
        (root / "txt" / f"doc-{i:03d}.txt").write_text(doc)
    half = len(documents) // 2
    lines = [json.dumps({"id": i, "text": d}) for i, d in enumerate(documents)]
    (root / "a.jsonl").write_text("\n".join(lines[:half]) + "\n\n")
    with gzip.open(root / "b.jsonl.gz", "wt") as f:
        f.write("\n".join(lines[half:]) + "\n")
    table = pa.table({"id": list(range(len(documents))), "text": documents})
    pq.write_table(table, root / "docs.parquet", row_group_size=7)
    return {
        "txt": [str(root / "txt" / "*.txt")],
        "jsonl": [str(root / "a.jsonl"), str(root / "b.jsonl.gz")],
        "parquet": [str(root / "docs.parquet")],
    }


def prepare(sources: list[str], out: Path, *extra: str) -> int:
    return data_main(["prepare", "--source", *sources, "--out", str(out), *extra])


def test_txt_jsonl_parquet_give_identical_token_streams(tmp_path):
    documents = corpus_documents()
    tok_file = train_bpe(tmp_path / "tokenizer.json", documents)
    sources = write_formats(tmp_path / "src", documents)
    streams = {}
    for kind, paths in sources.items():
        out = tmp_path / f"data-{kind}"
        assert prepare(paths, out, "--tokenizer", str(tok_file)) == 0
        streams[kind], info = shards.load(str(out))
        index = json.loads((out / "index.json").read_text())
        assert index["dtype"] == "<u2" and streams[kind].dtype == np.uint16
        assert index["documents"] == DOCUMENTS and len(index["shards"]) >= 1
        sha = hashlib.sha256(tok_file.read_bytes()).hexdigest()
        assert info.sha256 == sha and info.vocab_size == VOCAB and info.kind == "huggingface"
        assert (out / "tokenizer.json").read_bytes() == tok_file.read_bytes()
    assert np.array_equal(streams["txt"], streams["jsonl"])
    assert np.array_equal(streams["txt"], streams["parquet"])

    # Documents are separated by the end-of-text token, and decode back to the text.
    stream, eos = streams["txt"], info.eos_id
    assert int((stream == eos).sum()) == DOCUMENTS and stream[-1] == eos
    tok = tokenizers_mod.for_data(str(tmp_path / "data-txt"), info)
    first = stream[: int(np.argmax(stream == eos))].tolist()
    assert tok.decode(first) == documents[0]


def test_byte_level_and_wide_vocabularies(tmp_path):
    (tmp_path / "a.txt").write_text("héllo tpupod\n")
    assert prepare([str(tmp_path / "a.txt")], tmp_path / "bytes") == 0
    tokens, info = shards.load(str(tmp_path / "bytes"))
    assert tokens.dtype == np.uint8 and info.kind == "bytes" and info.sha256 is None
    assert tokens.tobytes() == "héllo tpupod\n".encode() + b"\x00"
    assert not (tmp_path / "bytes" / "tokenizer.json").exists()
    assert shards.token_dtype(65536) == np.dtype("<u2")
    assert shards.token_dtype(65537) == np.dtype("<u4")


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    sources = write_formats(tmp_path / "src", ["one document", "two"])
    cases = {
        "field-jsonl": (sources["jsonl"], ["--text-field", "body"], "a.jsonl line 1: no text field 'body' (it has: id, text)"),
        "field-parquet": (sources["parquet"], ["--text-field", "body"], "no text column 'body' (columns: id, text)"),
        "not-gzip": ([str(tmp_path / "bad.jsonl.gz")], [], "cannot read"),
        "empty": ([str(tmp_path / "empty.txt")], [], "no documents"),
        "missing": ([str(tmp_path / "nowhere" / "*.txt")], [], "no such file"),
        "tokenizer": (sources["txt"], ["--tokenizer", str(tmp_path / "empty.txt")], "not a Hugging Face tokenizer.json"),
    }  # fmt: skip
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    (tmp_path / "empty.txt").write_text("")
    for name, (paths, extra, expected) in cases.items():
        out = tmp_path / f"out-{name}"
        assert prepare(paths, out, *extra) == 2, name
        assert expected in one_error_line(capsys), name
        assert not out.exists() or not list(out.iterdir()), f"{name} left files behind"


def test_missing_field_from_the_command_line(tmp_path):
    """The real command: one line on stderr, exit 2, no traceback."""
    sources = write_formats(tmp_path / "src", ["a document"])
    cmd = [sys.executable, "-m", "trainer.data", "prepare", "--source", *sources["jsonl"],
           "--out", str(tmp_path / "out"), "--text-field", "content"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert "no text field 'content'" in done.stderr and "--text-field" in done.stderr


def test_out_with_prepared_data_is_refused(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("text")
    assert prepare([str(tmp_path / "a.txt")], tmp_path / "out") == 0
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert prepare([str(tmp_path / "a.txt")], tmp_path / "out") == 2
    assert "already holds prepared data" in one_error_line(capsys)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before


def test_shards_split_and_load_back_in_order(tmp_path):
    info = tokenizers_mod.TokenizerInfo("huggingface", 70000, 3, "0" * 64, "tokenizer.json")
    writer = shards.ShardWriter(str(tmp_path / "d"), info, shard_bytes=4000)
    chunks = [np.arange(n, dtype=np.uint32) + 65000 for n in (700, 1, 2500)]
    for chunk in chunks:
        writer.add(chunk)
    index = writer.finish(documents=3)
    assert index["dtype"] == "<u4" and [s["tokens"] for s in index["shards"]] == [
        1000,
        1000,
        1000,
        201,
    ]
    tokens, loaded = shards.load(str(tmp_path / "d"))
    assert np.array_equal(tokens, np.concatenate(chunks)) and loaded == info


def test_sources_tokenizer_and_out_on_gcs(tmp_path, gcs_emulator):
    """gs:// everywhere (the GCS emulator): globs, the tokenizer file, the output."""
    import gcsfs

    documents = corpus_documents(count=6)
    tok_file = train_bpe(tmp_path / "tokenizer.json", documents, vocab=400)
    local = write_formats(tmp_path / "src", documents)
    fs = gcsfs.GCSFileSystem()
    for path in [*local["jsonl"], *local["parquet"], str(tok_file)]:
        fs.put(path, f"tpupod-test/in/{Path(path).name}")
    assert prepare([str(tmp_path / "src" / "docs.parquet")], tmp_path / "local",
                   "--tokenizer", str(tok_file)) == 0  # fmt: skip
    for kind, sources in {"jsonl": ["gs://tpupod-test/in/*.jsonl*"],
                          "parquet": ["gs://tpupod-test/in/docs.parquet"]}.items():  # fmt: skip
        out = f"gs://tpupod-test/data-{kind}"
        assert prepare(sources, out, "--tokenizer", "gs://tpupod-test/in/tokenizer.json") == 0
        tokens, info = shards.load(out)
        assert np.array_equal(tokens, shards.load(str(tmp_path / "local"))[0])
        assert fs.cat(f"{out}/tokenizer.json") == tok_file.read_bytes() and info.vocab_size == 400


def test_training_imports_neither_tokenizers_nor_pyarrow():
    """Workers install no `data` group: the training path must not import its packages."""
    code = ("import sys, trainer.cli, trainer.train, trainer.data, trainer.checkpoint; "
            "print(sorted({'tokenizers', 'pyarrow', 'trainer.prepare'} & set(sys.modules)))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
