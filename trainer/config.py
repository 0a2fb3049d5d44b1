"""Run configuration: presets as data, YAML files and `--set key=value` overrides.

A config is one flat frozen dataclass so that every field is addressable by `--set` and the
whole run is described by one JSON-able dict (stored beside each checkpoint).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml


class BadInput(Exception):
    """User error: printed as one line, exit code 2, no traceback."""


@dataclass(frozen=True)
class Config:
    # Model.
    vocab_size: int = 256  # byte-level tokens
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 192
    seq_len: int = 64
    rope_theta: float = 10000.0
    compute_dtype: str = "auto"  # auto: bfloat16 on accelerators, float32 on CPU
    # auto: cuDNN's fused attention on a GPU in 16-bit (never materialises the T x T scores),
    # else XLA's; `xla` or `cudnn` to choose.
    attention: str = "auto"
    remat: bool = False  # recompute each block's activations in the backward pass (memory)
    # Optimisation.
    batch_size: int = 8  # global batch, in sequences
    batch_size_by_generation: dict = field(default_factory=dict)  # e.g. {"v5e": 256}
    steps: int = 20
    learning_rate: float = 3e-3
    warmup_steps: int = 5
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    # Mesh: -1 means "all remaining devices".
    mesh_data: int = -1
    mesh_fsdp: int = 1
    # Data: "" = default corpus (stdlib sources, prepared once into a local cache).
    data: str = ""
    shuffle: bool = True
    # Logging and checkpoints.
    log_every: int = 1
    checkpoint_every: int = 5  # steps; 0 disables step-based saves
    checkpoint_every_seconds: float = 0.0  # 0 disables time-based saves
    checkpoint_async: bool = True
    # ocdbt: Orbax's default on GCS and what production runs, everywhere (the local pod's emulator
    # included); plain: one tensorstore object per array chunk, the format before issue 15.
    checkpoint_format: str = "ocdbt"
    # zstd on the arrays' chunks (Orbax's default): `small`'s float32 state shrinks by about 7 %,
    # for host CPU on every save that a CPU-bound worker takes from its steps. Any step restores
    # either way (each array's metadata names its compressor).
    checkpoint_compression: bool = False
    keep_latest: int = 3
    # The local tier (tpupod_job.local_tier): each process's own copy every N steps on its VM's
    # disk ($TPUPOD_LOCAL_CHECKPOINT_DIR), what a restart on the same VMs restores; 0 disables.
    local_checkpoint_every: int = 2
    keep_every: int = 0  # additionally keep every M-th step; 0 disables
    heartbeat_seconds: float = 2.0
    stall_seconds: float = 600.0  # no step progress this long: stop heartbeating (a hang)


PRESETS: dict[str, dict] = {
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, d_ff=192, seq_len=64, batch_size=8, steps=20),
    # The CPU benchmark model (52M parameters). Wide and shallow on purpose: a CPU's matmuls
    # grow with width squared, its elementwise work, transposes and attention softmax only with
    # width, so d_model 1024 spends more of each step in matmuls than 512 x 8 layers did.
    "small": dict(
        d_model=1024,
        n_layers=4,
        n_heads=8,  # head_dim 128, as in `1b`
        d_ff=2816,  # 2.75 x d_model, as in `1b`
        seq_len=256,
        batch_size=16,
        steps=50,
        learning_rate=1e-3,
        warmup_steps=10,
        log_every=5,
        checkpoint_every=25,
        local_checkpoint_every=5,
    ),
    "350m": dict(
        d_model=1024,
        n_layers=24,
        n_heads=16,
        d_ff=4096,
        seq_len=2048,
        batch_size=64,
        batch_size_by_generation={"v4": 256, "v5e": 256, "v5p": 512, "v6e": 512, "h100": 64},
        steps=20000,
        learning_rate=3e-4,
        warmup_steps=1000,
        log_every=10,
        checkpoint_every=500,
        local_checkpoint_every=100,
        checkpoint_every_seconds=1800,
        keep_every=5000,
        mesh_data=1,
        mesh_fsdp=-1,
    ),
    "1b": dict(
        d_model=2048,
        n_layers=20,
        n_heads=16,
        d_ff=5632,
        seq_len=2048,
        batch_size=64,
        batch_size_by_generation={"v4": 256, "v5e": 128, "v5p": 512, "v6e": 256, "h100": 16},
        steps=50000,
        learning_rate=2e-4,
        warmup_steps=2000,
        log_every=10,
        checkpoint_every=500,
        local_checkpoint_every=100,
        checkpoint_every_seconds=1800,
        keep_every=5000,
        mesh_data=1,
        mesh_fsdp=-1,
    ),
}

CHECKPOINT_FORMATS = ("ocdbt", "plain")
FIELDS = {f.name: f for f in dataclasses.fields(Config)}
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")


def _coerce(key: str, raw: str):
    """Parses a `--set` value with the type of the field's default."""
    default = getattr(Config(), key)
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, dict):
            value = yaml.safe_load(raw)
            if not isinstance(value, dict):
                raise ValueError(raw)
            return value
    except ValueError:
        raise BadInput(f"--set {key}={raw}: expected {type(default).__name__}") from None
    return raw


def _check_keys(overrides: dict, where: str) -> None:
    for key in overrides:
        if key not in FIELDS:
            raise BadInput(f"unknown config key {key!r} in {where} (known: {', '.join(FIELDS)})")


def load_config(name: str, sets: list[str] = (), **direct) -> Config:
    """Preset name or YAML path, then `--set` overrides, then direct (flag) values."""
    if name in PRESETS:
        values = dict(PRESETS[name])
    elif name.endswith((".yaml", ".yml")) and Path(name).is_file():
        try:
            loaded = yaml.safe_load(Path(name).read_text()) or {}
        except yaml.YAMLError as e:
            raise BadInput(f"config {name}: invalid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(loaded, dict):
            raise BadInput(f"config {name}: expected a mapping")
        base = loaded.pop("preset", None)
        values = dict(PRESETS.get(base, {})) if base is not None else {}
        if base is not None and base not in PRESETS:
            raise BadInput(f"config {name}: unknown preset {base!r}")
        _check_keys(loaded, name)
        values.update(loaded)
    else:
        raise BadInput(f"unknown config {name!r}: use one of {', '.join(PRESETS)} or a .yaml file")
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep:
            raise BadInput(f"--set {item!r}: expected key=value")
        _check_keys({key: None}, "--set")
        values[key] = _coerce(key, raw)
    values.update({k: v for k, v in direct.items() if v is not None})
    cfg = Config(**values)
    validate(cfg)
    return cfg


def bound_loss(cfg: Config, max_loss_s: float | None) -> Config:
    """A time-based save at least every `max_loss_s` (the job's max_loss_minutes): with no
    notice, a preemption loses at most that much work, whatever the step time. A tighter
    checkpoint_every_seconds stays."""
    if max_loss_s is None:
        return cfg
    if max_loss_s <= 0:
        raise BadInput(f"--max-loss-s {max_loss_s:g}: give seconds > 0")
    if 0 < cfg.checkpoint_every_seconds <= max_loss_s:
        return cfg
    return dataclasses.replace(cfg, checkpoint_every_seconds=float(max_loss_s))


def explicit_keys(name: str, sets: list[str] = ()) -> set[str]:
    """The keys the user chose (a YAML file's own keys, `--set`), as opposed to a preset's."""
    keys = {item.partition("=")[0] for item in sets}
    if name not in PRESETS and Path(name).is_file():
        loaded = yaml.safe_load(Path(name).read_text()) or {}
        keys |= set(loaded) - {"preset"} if isinstance(loaded, dict) else set()
    return keys


def validate(cfg: Config) -> None:
    if cfg.d_model % cfg.n_heads or (cfg.d_model // cfg.n_heads) % 2:
        raise BadInput(f"d_model={cfg.d_model} must split into {cfg.n_heads} even-sized heads")
    for key in ("batch_size", "steps", "seq_len", "n_layers", "log_every"):
        if getattr(cfg, key) <= 0:
            raise BadInput(f"{key} must be positive, got {getattr(cfg, key)}")
    if cfg.keep_latest < 1:
        raise BadInput("keep_latest must be >= 1")
    if cfg.attention not in ATTENTION_IMPLEMENTATIONS:
        raise BadInput(
            f"attention={cfg.attention!r}: use one of {', '.join(ATTENTION_IMPLEMENTATIONS)}"
        )
    if cfg.checkpoint_format not in CHECKPOINT_FORMATS:
        known = ", ".join(CHECKPOINT_FORMATS)
        raise BadInput(f"checkpoint_format={cfg.checkpoint_format!r}: use one of {known}")


def with_generation_batch(cfg: Config, generation: str | None) -> Config:
    """Applies the per-generation global batch size when the device generation has one."""
    if generation and generation in cfg.batch_size_by_generation:
        return dataclasses.replace(cfg, batch_size=int(cfg.batch_size_by_generation[generation]))
    return cfg


def shape_signature(cfg: Config) -> dict:
    """The fields that fix parameter shapes: a checkpoint only restores into the same ones."""
    keys = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff")
    return {k: getattr(cfg, k) for k in keys}
