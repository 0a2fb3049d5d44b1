"""Tokenizers a run can train on: `bytes` (one token per UTF-8 byte) or a Hugging Face
`tokenizer.json`.

`tokenizers` is imported only when a tokenizer file is loaded (preparing data, sampling): workers
that only train never install it. A tokenizer's identity is the sha256 of its file (`bytes` for
the byte level), which prepared data and checkpoints record so a run always decodes what it
trained on.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

from trainer import storage
from trainer.config import BadInput

BYTES = "bytes"
FILE_NAME = "tokenizer.json"  # the copy beside the shards
# End-of-text tokens by the names common tokenizers give them, first match wins.
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]")
BYTES_EOS = 0  # NUL: never in text, so it can separate byte-level documents


@dataclass(frozen=True)
class TokenizerInfo:
    """What an index records about its tokenizer (and a checkpoint's meta, by `identity`)."""

    kind: str  # "bytes" | "huggingface"
    vocab_size: int
    eos_id: int | None
    sha256: str | None  # of the tokenizer file; None for bytes
    file: str | None = None  # name of the copy beside the shards

    @property
    def identity(self) -> str:
        return self.sha256 or self.kind

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict) -> TokenizerInfo:
        return cls(**{k: value.get(k) for k in ("kind", "vocab_size", "eos_id", "sha256", "file")})


def identity_of(recorded: dict | None) -> str:
    """A recorded tokenizer block's identity; checkpoints from before tokenizers were recorded
    are byte-level."""
    return TokenizerInfo.from_json(recorded).identity if recorded else BYTES


BYTES_INFO = TokenizerInfo(BYTES, 256, BYTES_EOS, None)
OLD_BYTES_INFO = TokenizerInfo(BYTES, 256, None, None)  # tpupod-bytes-v1: no EOS token


class Tokenizer:
    """encode/decode plus the info an index records."""

    def __init__(self, info: TokenizerInfo, hf=None, raw: bytes | None = None):
        self.info, self._hf, self.raw = info, hf, raw

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._hf is None:
            return [list(t.encode("utf-8")) for t in texts]
        return [e.ids for e in self._hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        if self._hf is None:
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return self._hf.decode(ids, skip_special_tokens=False)


def load(spec: str, expect_sha256: str | None = None) -> Tokenizer:
    """`bytes`, or a tokenizer.json (local path or gs://); one-line BadInput when unusable."""
    if spec == BYTES:
        return Tokenizer(BYTES_INFO)
    try:
        raw = storage.read_bytes(spec)
    except (OSError, ValueError) as e:
        raise BadInput(f"tokenizer {spec}: cannot read it ({_first_line(e)})") from None
    sha = hashlib.sha256(raw).hexdigest()
    if expect_sha256 and sha != expect_sha256:
        raise BadInput(
            f"tokenizer {spec} has sha256 {sha[:12]}, the data index records "
            f"{expect_sha256[:12]}: the copy beside the shards was changed; prepare the data again"
        )
    from tokenizers import Tokenizer as HfTokenizer  # lazy: only preparing and sampling

    try:
        hf = HfTokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - the library raises bare Exceptions for bad JSON
        raise BadInput(
            f"tokenizer {spec}: not a Hugging Face tokenizer.json ({_first_line(e)})"
        ) from None
    eos = next((hf.token_to_id(n) for n in EOS_NAMES if hf.token_to_id(n) is not None), None)
    if eos is None:
        raise BadInput(
            f"tokenizer {spec} has no end-of-text token (looked for {', '.join(EOS_NAMES)}); "
            "add one as a special token"
        )
    info = TokenizerInfo(
        "huggingface", hf.get_vocab_size(with_added_tokens=True), eos, sha, FILE_NAME
    )
    return Tokenizer(info, hf, raw)


def for_data(uri: str, info: TokenizerInfo) -> Tokenizer:
    """The tokenizer a prepared data directory was made with (its copy, checked by sha256)."""
    if info.kind == BYTES:
        return Tokenizer(info)
    return load(storage.join(uri, info.file or FILE_NAME), expect_sha256=info.sha256)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:200]
