"""Peak FLOP/s for MFU: the datasheet where one applies, else a jnp.dot probe, cached on disk.

The probe is noisy (neighbours share a VM) and costs seconds, once per start. So it is
conservative, keeping the fastest of at least MIN_REPEATS matmuls timed for at least MIN_SECONDS
(a slow probe would flatter model/peak), and its figure is cached in `dot_peak.json` under
$TPUPOD_CACHE_DIR (default `$XDG_CACHE_HOME/tpupod` or `~/.cache/tpupod`), keyed by what it
depends on. A restart reuses it; a corrupt or unwritable cache only means a fresh probe. A
copy beside the run's compile cache (its bucket) serves a recreated VM, whose disk is new.
$TPUPOD_FRESH_PEAK=1 forces one (and refreshes the cache): benchmarks want this run's figure.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import jax
import jax.numpy as jnp

# Dense bf16 peak FLOP/s per chip (vendor datasheets).
PEAK_FLOPS = {
    "v4": 275e12,
    "v5e": 197e12,
    "v5p": 459e12,
    "v6e": 918e12,
    "h100": 989e12,
    "h200": 989e12,
}


def generation(device) -> str | None:
    """Maps jax's device_kind ("TPU v5 lite", "NVIDIA H100 80GB HBM3", ...) to a table key."""
    kind = device.device_kind.lower()
    for needle, gen in (
        ("v6", "v6e"),
        ("v5 lite", "v5e"),
        ("v5e", "v5e"),
        ("v5", "v5p"),
        ("v4", "v4"),
        ("h100", "h100"),
        ("h200", "h200"),
    ):
        if needle in kind:
            return gen
    return None


CACHE_DIR_ENV = "TPUPOD_CACHE_DIR"
FRESH_ENV = "TPUPOD_FRESH_PEAK"
SOURCE = "measured:jnp.dot"
MIN_SECONDS = 1.0
MIN_REPEATS = 10


def measure_dot_peak(
    dtype=jnp.float32, n: int = 2048, min_seconds: float = MIN_SECONDS, repeats: int = MIN_REPEATS
) -> float:
    """This process's matmul FLOP/s: the fastest of >= `repeats` timed n x n jnp.dots, run for
    >= `min_seconds` in all (a slow outlier from a busy neighbour is then outvoted)."""
    a = jnp.ones((n, n), dtype)
    dot = jax.jit(jnp.dot)
    dot(a, a).block_until_ready()  # compile and warm up
    best, total, done = float("inf"), 0.0, 0
    while done < repeats or total < min_seconds:
        t0 = time.perf_counter()
        dot(a, a).block_until_ready()
        took = time.perf_counter() - t0
        best, total, done = min(best, took), total + took, done + 1
    return 2.0 * n**3 / best


def cache_path() -> Path:
    base = os.environ.get(CACHE_DIR_ENV)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        base = os.path.join(xdg, "tpupod")
    return Path(base) / "dot_peak.json"


def cache_key(dtype) -> str:
    """What the per-process figure depends on: the device, how many this process drives, how many
    processes share the machine's probe, the dtype, the jax version and the CPU count."""
    d = jax.local_devices()[0]
    return (
        f"{d.platform}:{d.device_kind}|{jax.local_device_count()} local devices|"
        f"{jax.process_count()} processes|{jnp.dtype(dtype).name}|jax {jax.__version__}|"
        f"{os.cpu_count()} cpus"
    )


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def cached(key: str, path: Path) -> dict | None:
    """The entry for `key` ({"flops": per process, "measured": unix s}), or None if unusable."""
    return _usable(_read(path).get(key))


def _usable(entry) -> dict | None:
    if not isinstance(entry, dict):
        return None
    flops, when = entry.get("flops"), entry.get("measured")
    ok = all(isinstance(v, int | float) and v > 0 for v in (flops, when))
    return entry if ok else None


def store(key: str, flops: float, path: Path, measured: float | None = None) -> None:
    """Atomically (tmp + rename) adds or replaces `key`; a cache that can't be written is skipped."""
    doc = _read(path)
    doc[key] = {"flops": flops, "measured": measured or round(time.time(), 3)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass


def fresh_forced() -> bool:
    return os.environ.get(FRESH_ENV, "").strip().lower() not in ("", "0", "false", "no")


SHARED_NAME = "dot_peak.json"


def _shared_doc(shared: str) -> dict:
    """The run's shared copy (beside its compile cache); {} when missing, unreadable or out of
    reach (a probe instead)."""
    from trainer import storage

    try:
        doc = json.loads(storage.read_bytes(storage.join(shared, SHARED_NAME)))
    except Exception:  # noqa: BLE001
        return {}
    return doc if isinstance(doc, dict) else {}


def _share(key: str, entry: dict, shared: str) -> None:
    """Adds `key` to the shared copy; one that cannot be written only costs a later probe."""
    from trainer import storage

    doc = _shared_doc(shared)  # read again: another process may have added its own key
    doc[key] = entry
    with contextlib.suppress(Exception):
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
        storage.write_bytes(storage.join(shared, SHARED_NAME), data)


def peak_flops(dtype, measure: bool = True, shared: str | None = None) -> tuple[float | None, str]:
    """Total peak FLOP/s over all global devices, and where it comes from: `table:<gen>`, else this
    process's probe times the process count, `measured:jnp.dot` or `measured:jnp.dot (cached
    <UTC time>)`. With measure=False, (None, "") where only a probe would tell. `shared` (the
    run's compile cache, in its bucket) keeps a copy that a recreated VM, whose disk starts
    empty, reads instead of probing again: the probe stops training for >= 1 s after the
    first step of every start (2.3-2.6 s on the local pod, at each of its recreates)."""
    gen = generation(jax.devices()[0])
    if gen is not None:
        return PEAK_FLOPS[gen] * jax.device_count(), f"table:{gen}"
    key, path = cache_key(dtype), cache_path()
    entry = None if fresh_forced() else cached(key, path)
    if entry is None and measure and shared and not fresh_forced():
        entry = _usable(_shared_doc(shared).get(key))
        if entry is not None:
            store(key, entry["flops"], path, measured=entry["measured"])
    if entry is not None:
        when = datetime.fromtimestamp(entry["measured"], UTC).strftime("%Y-%m-%dT%H:%MZ")
        return entry["flops"] * jax.process_count(), f"{SOURCE} (cached {when})"
    if not measure:
        return None, ""
    flops = measure_dot_peak(dtype)
    store(key, flops, path)
    if shared:
        _share(key, {"flops": flops, "measured": round(time.time(), 3)}, shared)
    return flops * jax.process_count(), SOURCE
