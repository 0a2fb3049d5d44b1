"""Compiled programs (the train step; a fresh state's init), kept per process beside the workdir,
used only by agreement.

Why not JAX's persistent compilation cache: it writes entries from process 0 alone, and on CPU the
other processes' keys differ, so after a restart process 0 would load a cached program while
process 1 compiled a fresh one, and their gloo collectives deadlock. Here every process keeps its
own entry, keyed by what the executable depends on (the lowered program, jax and jaxlib, the
backend, the devices, this process's index and the process count, XLA_FLAGS), and the processes
agree before using it: each loads its entry, an all-gather says whether all of them did, and
unless every one did, all compile fresh and each writes its entry. One path on TPU, GPU and CPU,
one process or many.

An entry is an executable and loading one runs its code: the cache lives in the job's own
workdir or bucket, trusted like its checkpoints. A missing, stale or unloadable entry only costs
a compile; a failed write is reported and ignored.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

import jax
import numpy as np

from trainer import storage

FORMAT = "1"  # bump when the entry layout changes


@dataclass
class Compiled:
    executable: object  # jax.stages.Compiled
    hit: bool  # every process loaded its entry
    why: str  # one line: where the program came from
    load_s: float  # reading + loading this process's entry (0 when it had none)


def entry_key(lowered, devices) -> str:
    """What the executable depends on, hashed: the same program on the same devices."""
    import jaxlib

    parts = [
        FORMAT,
        jax.__version__,
        jaxlib.__version__,
        jax.default_backend(),
        ",".join(f"{d.id}:{d.device_kind}:{d.process_index}" for d in devices),
        f"{jax.process_index()}/{jax.process_count()}",
        os.environ.get("XLA_FLAGS", ""),
        lowered.as_text(),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def entry_uri(cache_uri: str, key: str, program: str = "train-step") -> str:
    return storage.join(cache_uri, f"{program}-{key[:40]}-p{jax.process_index()}.xla")


def _one_line(err: Exception) -> str:
    first = str(err).splitlines()[0][:160] if str(err) else ""
    return f"{type(err).__name__}: {first}"


def _load(uri: str, lowered):
    """This process's entry as a loaded executable, or None (missing or unloadable) and why."""
    from jax.experimental import serialize_executable

    try:
        blob = storage.read_bytes(uri)  # one request: a missing entry is FileNotFoundError
        executable = serialize_executable.deserialize_and_load(
            blob, lowered.in_tree, lowered.out_tree
        )
    except FileNotFoundError:
        return None, "no entry"
    except Exception as e:  # noqa: BLE001 - any failure means: compile instead
        return None, f"unloadable ({_one_line(e)})"
    return executable, "loaded"


def _all_agree(ok: bool) -> list[bool]:
    """Every process's answer, the same list on every process (one small all-gather)."""
    if jax.process_count() == 1:
        return [ok]
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray([int(ok)], np.int32))
    return [bool(v) for v in np.asarray(gathered).reshape(-1)]


def _save(uri: str, executable) -> str | None:
    """Writes this process's entry; returns why it could not, or None."""
    from jax.experimental import serialize_executable

    try:
        blob, _, _ = serialize_executable.serialize(executable)
        storage.write_bytes(uri, blob)
        return None
    except Exception as e:  # noqa: BLE001 - a cache that cannot be written only costs time later
        return _one_line(e)


@dataclass
class Entry:
    """A lowered program and this process's cached executable for it, if it had one."""

    lowered: object  # jax.stages.Lowered
    uri: str | None  # its entry (None: no cache)
    executable: object | None  # the entry, loaded
    why: str
    load_s: float


def load_entry(lowered, devices, cache_uri: str | None, program: str = "train-step") -> Entry:
    """This process's entry for `lowered`, read and loaded. No collective: it may run on a
    thread beside the restore (trainer.steps); `agree` then runs on the loop's thread."""
    if not cache_uri:
        return Entry(lowered, None, None, "cache off", 0.0)
    uri = entry_uri(cache_uri, entry_key(lowered, devices), program)
    t0 = time.perf_counter()
    loaded, why = _load(uri, lowered)
    load_s = time.perf_counter() - t0 if loaded is not None else 0.0
    return Entry(lowered, uri, loaded, why, load_s)


def agree(entry: Entry) -> Compiled:
    """Every process's loaded entry if all have one (one all-gather, in the same place on every
    process), else all compile fresh and each writes its entry."""
    lowered, loaded, load_s = entry.lowered, entry.executable, entry.load_s
    if entry.uri is None:
        return Compiled(lowered.compile(), False, "cache off", 0.0)
    answers = _all_agree(loaded is not None)
    if all(answers):
        return Compiled(loaded, True, "every process loaded its entry", load_s)
    executable = lowered.compile()
    if loaded is not None:  # this entry was fine: another process lacked one; nothing to write
        missing = [i for i, ok in enumerate(answers) if not ok]
        return Compiled(executable, False, f"compiled (processes {missing} had no usable entry)",
                        load_s)  # fmt: skip
    reason = f"process {jax.process_index()}: {entry.why}"
    if failed := _save(entry.uri, executable):
        reason += f"; entry not written: {failed}"
    return Compiled(executable, False, f"compiled ({reason})", load_s)


def compile_program(
    lowered, devices, cache_uri: str | None, program: str = "train-step"
) -> Compiled:
    """The lowered program compiled, or every process's cached executable if all have one.
    `program` names its entries: "train-step" on every start, "init" on a start with no
    checkpoint to restore (a fresh state's random init compiles for seconds, like the step)."""
    return agree(load_entry(lowered, devices, cache_uri, program))
