"""The grain input pipeline, the run's vocabulary from its data, and
`python -m trainer.data prepare --source PATH_OR_GLOB... --out URI` (trainer.prepare).

Global row g of the stream is window perm_e[g mod W] of epoch e = g div W (a seeded permutation
per epoch). Step t's global batch is rows t*B .. t*B+B-1; process p of P reads only its slice
[p*B/P, (p+1)*B/P) of it. So the global batch is the same for any process count, and a grain
iterator's state (how many local batches it has produced) pins the exact position for resume.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass

import grain
import jax
import numpy as np

from trainer import shards
from trainer.config import BadInput, Config
from trainer.tokenizer import BYTES_INFO, TokenizerInfo


class LocalRows:
    """Random-access source of this process's rows of the global batch stream."""

    def __init__(self, tokens, seq_len, global_batch, process_index, process_count, seed, shuffle):
        self.tokens, self.seq_len = tokens, seq_len
        self.windows = (len(tokens) - 1) // seq_len
        self.global_batch, self.local_batch = global_batch, global_batch // process_count
        self.offset = process_index * self.local_batch
        self.seed, self.shuffle = seed, shuffle
        self._perms: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return 1 << 40  # endless: epochs repeat with fresh permutations

    def _window(self, g: int) -> int:
        epoch, pos = divmod(g, self.windows)
        if not self.shuffle:
            return pos
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.clear()
            rng = np.random.default_rng([self.seed, epoch])
            self._perms[epoch] = rng.permutation(self.windows)
        return int(self._perms[epoch][pos])

    def __getitem__(self, j: int) -> np.ndarray:
        step, r = divmod(int(j), self.local_batch)
        start = self._window(step * self.global_batch + self.offset + r) * self.seq_len
        return self.tokens[start : start + self.seq_len + 1].astype(np.int32)


@dataclass(frozen=True)
class Source:
    tokens: np.ndarray
    uri: str  # what the run trained on: a shard directory, or "synthetic"
    tokenizer: TokenizerInfo


def load_source(cfg: Config) -> Source:
    if cfg.data == "synthetic":
        return Source(shards.synthetic_tokens(cfg.seed), "synthetic", BYTES_INFO)
    uri = cfg.data or shards.default_corpus()
    tokens, info = shards.load(uri)
    return Source(tokens, uri, info)


def checkpoint_meta(cfg: Config, source: Source) -> dict:
    """What each checkpoint records about the run's data: `sample` decodes with it, a resume
    refuses another tokenizer."""
    return {"data": source.uri, "tokenizer": source.tokenizer.to_json(), "config": cfg.__dict__}


def fit_vocab(cfg: Config, source: Source, explicit: bool) -> tuple[Config, str | None]:
    """The model's vocabulary holds every token of the data: a preset's smaller `vocab_size` is
    raised to the tokenizer's (returns the note that says so), one set explicitly is refused."""
    need = source.tokenizer.vocab_size
    if cfg.vocab_size >= need:
        return cfg, None
    if explicit:
        raise BadInput(
            f"vocab_size={cfg.vocab_size} (set explicitly) is smaller than the data's tokenizer "
            f"vocabulary of {need} ({source.tokenizer.kind}, {source.uri}): set vocab_size={need} "
            "or more, or leave it to the data"
        )
    note = f"vocab_size raised from the preset's {cfg.vocab_size} to the data's tokenizer's {need}"
    return dataclasses.replace(cfg, vocab_size=need), note


def make_iterator(cfg: Config, tokens: np.ndarray):
    """This process's iterator of local batches [B/P, seq_len+1] (int32)."""
    windows = (len(tokens) - 1) // cfg.seq_len
    if windows < cfg.batch_size:
        raise BadInput(
            f"data has {len(tokens)} tokens = {max(windows, 0)} sequences of {cfg.seq_len}+1, "
            f"fewer than one batch of {cfg.batch_size}"
        )
    source = LocalRows(
        tokens,
        cfg.seq_len,
        cfg.batch_size,
        jax.process_index(),
        jax.process_count(),
        cfg.seed,
        cfg.shuffle,
    )
    ds = grain.MapDataset.source(source).batch(source.local_batch, drop_remainder=True)
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)))


def global_batch(local: np.ndarray, cfg: Config, sharding) -> jax.Array:
    shape = (cfg.batch_size, cfg.seq_len + 1)
    return jax.make_array_from_process_local_data(sharding, local, shape)


def main(argv: list[str] | None = None) -> int:
    from trainer import prepare, tokenizer

    parser = argparse.ArgumentParser(
        prog="python -m trainer.data", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="tokenize .txt, .jsonl(.gz), .parquet into shards")
    prep.add_argument(
        "--source",
        nargs="+",
        help="files, directories or globs, local or gs:// (default: the stdlib sources)",
    )
    prep.add_argument("--out", required=True, help="output directory: local path or gs://bucket/p")
    prep.add_argument(
        "--tokenizer",
        default=tokenizer.BYTES,
        help="`bytes` (default) or a Hugging Face tokenizer.json, local or gs://",
    )
    prep.add_argument("--text-field", default="text", help="JSON / Parquet field of the text")
    prep.add_argument("--glob", default=None, help="file pattern inside directories (default **/*)")
    args = parser.parse_args(argv)
    sources, pattern = (args.source, "**/*") if args.source else prepare.default_sources()
    try:
        index = prepare.prepare(
            sources, args.out, args.tokenizer, args.text_field, args.glob or pattern
        )
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(prepare.describe(index, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
