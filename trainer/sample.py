"""`python -m trainer sample --workdir URI [--step N] --prompt TEXT [--tokens N] [--temperature T]`:
text from a committed checkpoint, decoded with the tokenizer the run trained with.

Only the params are read (plain Orbax, a partial restore into numpy, as README's "Your weights
without tpupod" shows), so any machine with the checkpoint's bucket can sample, with no mesh and
no optimizer state. The step's `meta` item names the run's config, its data and its tokenizer;
the tokenizer comes from the copy beside the data's shards, checked against the recorded sha256.
Steps written before the meta recorded a tokenizer are byte-level.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys

from contract.layout import checkpoint_dir
from trainer import storage, tokenizer
from trainer.config import FIELDS, BadInput, Config

USAGE = "python -m trainer sample"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=USAGE, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--workdir",
        default=os.environ.get("TPUPOD_WORKDIR") or os.environ.get("TPUPOD_RUN_DIR"),
        help="the run's directory, local or gs:// [$TPUPOD_WORKDIR, $TPUPOD_RUN_DIR]",
    )
    p.add_argument("--step", type=int, help="checkpoint step (default: the latest committed)")
    p.add_argument("--prompt", required=True, help="text to continue ('' starts a document)")
    p.add_argument("--tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument(
        "--temperature", type=float, default=0.8, help="softmax temperature; 0 = greedy (0.8)"
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    return p


def _open(workdir: str, step: int | None):
    """(directory, step, meta) of a committed step; BadInput when there is none."""
    import orbax.checkpoint as ocp

    directory = checkpoint_dir(storage.normalize(workdir))
    if not storage.exists(directory):
        raise BadInput(f"no checkpoints in {workdir} (is it the trainer's --workdir?)")
    manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(read_only=True),
        item_handlers={"meta": ocp.JsonCheckpointHandler()},
    )
    steps = sorted(manager.all_steps())
    if not steps:
        raise BadInput(f"no committed checkpoint in {directory}")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise BadInput(f"step {step} is not a committed checkpoint in {directory} (has {steps})")
    meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    return directory, step, meta


def _params(directory: str, step: int):
    """The params of one step as numpy arrays (README's plain-Orbax partial restore)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    path = storage.join(directory, str(step), "state")
    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(path).item_metadata.tree
    params_only = {"params": tree["params"]}
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), params_only)
    restored = checkpointer.restore(
        path, args=ocp.args.PyTreeRestore(params_only, restore_args=as_numpy, partial_restore=True)
    )
    return restored["params"]


def _config(meta: dict) -> Config:
    recorded = meta.get("config") or meta["shapes"]
    cfg = Config(**{k: v for k, v in recorded.items() if k in FIELDS})
    return dataclasses.replace(cfg, compute_dtype="float32", attention="xla", remat=False)


def generate(workdir: str, prompt: str, tokens: int, temperature: float, seed: int = 0,
             step: int | None = None):  # fmt: skip
    """(step, prompt + continuation, tokenizer info) sampled from `workdir`'s checkpoint."""
    import jax
    import numpy as np

    from trainer.model import Transformer

    if tokens < 1:
        raise BadInput(f"--tokens must be positive, got {tokens}")
    directory, step, meta = _open(workdir, step)
    cfg = _config(meta)
    if "tokenizer" in meta:
        info = tokenizer.TokenizerInfo.from_json(meta["tokenizer"])
        tok = tokenizer.for_data(meta["data"], info)
    else:
        tok = tokenizer.Tokenizer(tokenizer.OLD_BYTES_INFO)
    params = _params(directory, step)
    model = Transformer(cfg, jax.numpy.float32)
    logits_at = jax.jit(lambda p, x, i: model.apply({"params": p}, x)[0, i])

    eos = tok.info.eos_id
    prompt_ids = tok.encode_batch([prompt])[0]
    context = ([eos] if eos is not None else []) + prompt_ids
    if not context:
        context = [int(ord("\n"))]  # byte-level data of old checkpoints has no end-of-text token
    rng = np.random.default_rng(seed)
    generated: list[int] = []
    for _ in range(tokens):
        window = context[-cfg.seq_len :]
        buffer = np.zeros((1, cfg.seq_len), np.int32)
        buffer[0, : len(window)] = window
        logits = np.asarray(logits_at(params, buffer, len(window) - 1), np.float64)
        logits = logits[: tok.info.vocab_size]  # a model vocab padded past the tokenizer's
        if temperature <= 0:
            token = int(np.argmax(logits))
        else:
            z = (logits - logits.max()) / temperature
            probs = np.exp(z) / np.exp(z).sum()
            token = int(rng.choice(len(probs), p=probs))
        if token == eos:
            break
        context.append(token)
        generated.append(token)
    return step, tok.decode(prompt_ids + generated), tok.info


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax's read-only notices
    try:
        if not args.workdir:
            raise BadInput("--workdir (or $TPUPOD_WORKDIR, $TPUPOD_RUN_DIR) is required")
        step, text, info = generate(
            args.workdir, args.prompt, args.tokens, args.temperature, args.seed, args.step
        )
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    tok = f"{info.kind} {info.sha256[:12]}" if info.sha256 else info.kind
    print(f"# step {step}, temperature {args.temperature:g}, tokenizer {tok}", file=sys.stderr)
    print(text, flush=True)
    return 0
