"""Training on your own data: a BPE tokenizer trained here on the default corpus, the same
documents prepared from .txt, .jsonl and .parquet (identical token streams), `tiny` trained on
them (the preset's byte vocabulary raised to the tokenizer's, loss falls), a SIGTERM resume that
ends bitwise equal, `python -m trainer sample` decoding with the run's tokenizer, and each
mismatch (vocabulary, tokenizer, corrupt shard) one line and exit 2."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from test_data_prepare import VOCAB, corpus_documents, prepare, train_bpe, write_formats
from trainer_testlib import REPO, Trainer, run_ok, summary, trainer_env

from trainer import shards

STEPS = 24


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict:
    """The BPE tokenizer and the documents prepared from each format (streams compared)."""
    root = tmp_path_factory.mktemp("data")
    documents = corpus_documents()
    tok = train_bpe(root / "tokenizer.json", documents)
    streams, out = {}, {}
    for kind, paths in write_formats(root / "src", documents).items():
        out[kind] = root / f"data-{kind}"
        assert prepare(paths, out[kind], "--tokenizer", str(tok)) == 0
        streams[kind] = shards.load(str(out[kind]))[0]
    assert np.array_equal(streams["txt"], streams["jsonl"])
    assert np.array_equal(streams["txt"], streams["parquet"])
    return {"root": root, "tokenizer": tok, **out}


@pytest.fixture(scope="module")
def reference(prepared) -> dict:
    """An uninterrupted run on the Parquet-prepared data."""
    root = prepared["root"]
    wd = root / "ref"
    args = ["--config", "tiny", "--steps", STEPS, "--set", f"data={prepared['parquet']}"]
    t = Trainer([str(a) for a in [*args, "--workdir", wd]], root, "ref", trainer_env())
    try:
        assert t.wait() == 0, t.stderr[-4000:]
    finally:
        t.kill()
    return {"args": args, "trainer": t, "workdir": wd}


def test_tiny_trains_on_bpe_data_with_the_tokenizers_vocabulary(prepared, reference):
    ref = reference["trainer"]
    setup = next(r for r in ref.lines() if r.get("event") == "setup")
    sha = hashlib.sha256(prepared["tokenizer"].read_bytes()).hexdigest()
    assert setup["config"]["vocab_size"] == VOCAB
    assert setup["tokenizer"]["sha256"] == sha and setup["tokenizer"]["kind"] == "huggingface"
    note = "vocab_size raised from the preset's 256 to the data's tokenizer's 1000"
    assert setup["vocab_note"] == note and f"note: {note}" in ref.stderr
    losses = [r["loss"] for r in ref.lines() if "loss" in r and "event" not in r]
    assert losses[0] > 6.5 and losses[-1] < losses[0] - 0.5, losses  # ln(1000) = 6.9


def test_sigterm_resume_is_bitwise_and_sample_decodes(spawn, prepared, reference, tmp_path):
    args, wd = reference["args"], tmp_path / "term"
    t = spawn([*args, "--workdir", wd], tmp_path, "term1")
    t.wait_for(lambda: t.last_step() >= 4, what="step 4")
    t.signal(signal.SIGTERM)
    assert t.wait() == 75, t.stderr[-3000:]
    again = run_ok(spawn, [*args, "--workdir", wd], tmp_path, "term2")
    stopped = next(r["step"] for r in t.lines() if r.get("event") == "preempted")
    assert any(r.get("event") == "restored" and r["step"] == stopped for r in again.lines())
    assert summary(wd)["params_fingerprint"] == summary(reference["workdir"])["params_fingerprint"]

    # `sample` finds the tokenizer through the data the run recorded, and decodes with it.
    cmd = [sys.executable, "-m", "trainer", "sample", "--workdir", str(wd), "--prompt",
           "def __init__(self", "--tokens", "24", "--temperature", "0.7"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=trainer_env(), capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("def __init__(self") and len(done.stdout) > 24, done.stdout
    sha = hashlib.sha256(prepared["tokenizer"].read_bytes()).hexdigest()
    assert f"# step {STEPS}, temperature 0.7, tokenizer huggingface {sha[:12]}" in done.stderr
    printable = sum(c.isprintable() or c.isspace() for c in done.stdout)
    assert printable >= 0.9 * len(done.stdout), done.stdout  # BPE pieces decoded to text


def _bad(spawn, tmp_path, name: str, args: list, expected: str) -> str:
    t = spawn(args, tmp_path, name)
    assert t.wait() == 2, t.stderr[-3000:]
    lines = t.stderr.strip().splitlines()
    assert "Traceback" not in t.stderr and expected in lines[-1], lines[-3:]
    return lines[-1]


def test_mismatches_are_one_line_exit_2(spawn, prepared, reference, tmp_path):
    base = ["--config", "tiny", "--steps", STEPS]
    # 1. A vocabulary set explicitly below the tokenizer's: refused, naming both.
    line = _bad(spawn, tmp_path, "vocab", [*base, "--workdir", tmp_path / "v", "--set",
                f"data={prepared['txt']}", "--set", "vocab_size=512"],
                "vocab_size=512 (set explicitly) is smaller than the data's tokenizer vocabulary "
                "of 1000")  # fmt: skip
    assert "set vocab_size=1000" in line

    # 2. The reference's checkpoint resumed on data of another tokenizer of the same size.
    root = tmp_path / "other"
    other_tok = train_bpe(tmp_path / "other.json", corpus_documents(start=40, count=20))
    paths = write_formats(root, corpus_documents(start=40, count=20))["jsonl"]
    assert prepare(paths, tmp_path / "other-data", "--tokenizer", str(other_tok)) == 0
    wd = tmp_path / "resume"
    shutil.copytree(reference["workdir"], wd)
    ckpt = wd / "checkpoints"
    listing = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*"))
    _bad(spawn, tmp_path, "tokenizer", [*base[:-1], STEPS + 4, "--workdir", wd, "--set",
         f"data={tmp_path / 'other-data'}"], "was trained with tokenizer")  # fmt: skip
    assert sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*")) == listing

    # 3. A corrupt shard.
    data = tmp_path / "corrupt"
    shutil.copytree(prepared["txt"], data)
    shard = data / json.loads((data / "index.json").read_text())["shards"][0]["name"]
    shard.write_bytes(b"\xff\xff" + shard.read_bytes()[2:])
    _bad(spawn, tmp_path, "corrupt", [*base, "--workdir", tmp_path / "c", "--set",
         f"data={data}"], f"shard {shard.name} is corrupt")  # fmt: skip
