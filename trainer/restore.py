"""Restore the newest verified, readable committed step, and set the others aside.

Orbax lists only committed steps, but a committed step can still be wrong: a file truncated,
rewritten or deleted under it (its manifest's sizes and CRC32Cs disagree: trainer/manifest.py),
metadata that fails to decode. Each such step is reported in one line (which step, which file,
what was wrong), and the trainer restores the newest earlier step, state and data iterator
alike, so the run still ends bitwise equal to an uninterrupted one.

An unreadable step is moved aside, never deleted: renamed to `<step>.unreadable-<UTC time>`, a
name Orbax's step discovery ignores (it lists only `^\\d+$` names), so the next save of that step
number is a fresh directory. On GCS a rename is a copy of every object, a check that the copy
lists the same names, sizes and CRC32Cs, and only then the delete of the source.
No step readable: `NoReadableStep` (bad input: one line, exit 2), with nothing moved.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import sys
import time
from dataclasses import dataclass

import jax
import numpy as np

from contract.checkpoint_manifest import aside_name
from trainer import manifest, storage
from trainer.config import BadInput

# What a missing, truncated or undecodable file raises: tensorstore reports as ValueError,
# missing JSON/grain files as FileNotFoundError (an OSError), broken JSON as ValueError.
UNREADABLE = (OSError, ValueError, KeyError, EOFError)


class NoReadableStep(BadInput):
    """Every committed step failed to restore; nothing was moved."""


class NotVerified(Exception):
    """(file, reason): the step's files are not the ones its manifest lists."""


@dataclass
class Unreadable:
    step: int
    file: str
    reason: str
    moved_to: str | None = None

    def line(self, restored: int) -> str:
        where = f", moved aside to {self.moved_to}" if self.moved_to else ""
        return (
            f"checkpoint step {self.step} is unreadable ({self.file}: {self.reason}); "
            f"restoring step {restored} instead{where}"
        )


def unreadable_cause(err: BaseException) -> BaseException | None:
    """The innermost error in `err`'s chain that means a file is missing, short or undecodable
    (Orbax wraps tensorstore's ValueError in a bare Exception); None for anything else."""
    found, seen = None, set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, UNREADABLE):
            found = err
        err = err.__cause__ or err.__context__
    return found


# tensorstore: Error reading "KEY" in OCDBT database at local file "DIR/state/": WHAT
#             Error reading "KEY" in OCDBT database at gs://BUCKET/DIR/state/: WHAT
_OCDBT_READ = re.compile(
    r'reading "([^"]+)" in OCDBT database at (?:local file )?"?([^"\s]+?)"?: (.*)'
)


# Orbax, for an item directory that is gone: Unknown key: state. Available keys: ...
_MISSING_ITEM = re.compile(r"Unknown key: (\w+)\.")


def describe(step_dir: str, err: BaseException) -> tuple[str, str]:
    """(file relative to the step directory, what was wrong) from an unreadable cause."""
    text = " ".join(str(err).split()) or type(err).__name__
    root = step_dir.removeprefix("file://").rstrip("/") + "/"
    if m := _MISSING_ITEM.search(text):
        file, reason = f"{m.group(1)}/", "missing"
    elif m := _OCDBT_READ.search(text):
        key, database, what = m.groups()
        where = database.split(root, 1)[-1].rstrip("/") or "."
        file, reason = f"{where}/ (OCDBT key {key})", what or text
    elif m := re.search(re.escape(root) + r"([^\s\"'\\,;:]+)", text):
        file, reason = m.group(1), text.replace(root, "")
    else:
        file, reason = "?", text
    return file, reason[:240] + ("..." if len(reason) > 240 else "")


def _quiet_failed_reads(unraisable) -> None:
    """After a failed restore, tensorstore callbacks still due call into Orbax's closed event
    loop, and its abandoned reads are collected with their errors: both say nothing the one line
    has not said."""
    err = unraisable.exc_value
    closed = isinstance(err.__cause__, GeneratorExit) or "Event loop is closed" in str(err)
    if closed or unreadable_cause(err) is not None:
        return
    sys.__unraisablehook__(unraisable)


def _all_processes_agree(ok: bool) -> bool:
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _forget_listings(directory: str) -> None:
    """Drops every cached listing of this filesystem (Orbax lists through an instance of its
    own, whose cache still holds the moved step)."""
    for instance in list(type(storage.fs(directory))._cache.values()):
        instance.invalidate_cache()


def restore_newest_readable(checkpoints, abstract_state, data_iter):
    """(step, state, data_iter, [Unreadable]) from the newest step every process can read;
    (None, None, data_iter, []) when there is no committed step at all."""
    steps = sorted(checkpoints.manager.all_steps(), reverse=True)
    if not steps:
        return None, None, data_iter, []
    # gcsfs logs a traceback for every object found missing; the one line below says it all.
    logging.getLogger("fsspec.prefetcher").setLevel(logging.CRITICAL)
    # In place before the first read, not once one failed: a failed read's siblings can land
    # on Orbax's closed event loop before the error reaches the `except` below.
    previous_hook, sys.unraisablehook = sys.unraisablehook, _quiet_failed_reads
    skipped: list[Unreadable] = []
    t_verify = time.perf_counter()
    verified_run = manifest.any_in(checkpoints.directory, steps)
    checkpoints.verify_s = time.perf_counter() - t_verify
    for step in steps:
        file, reason = "?", "another process could not read it"
        try:
            t_verify = time.perf_counter()
            problem = manifest.check(checkpoints.step_dir(step), verified_run)
            checkpoints.verify_s += time.perf_counter() - t_verify
            if problem:
                raise NotVerified(*problem)
            checkpoints.check_compatible(step, abstract_state)
            state, data_iter = checkpoints.restore(step, abstract_state, data_iter)
            ok = True
        except NotVerified as e:
            ok, (file, reason) = False, e.args
        except BadInput:
            raise
        except Exception as e:
            if (cause := unreadable_cause(e)) is None:
                raise
            # Orbax's abandoned read tasks end with the same error; asyncio would log each one
            # with its traceback ("Task exception was never retrieved") whenever GC finds it.
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
            ok, (file, reason) = False, describe(checkpoints.step_dir(step), cause)
        if not ok:  # collect the abandoned reads now, while the quiet hook is in place
            gc.collect()
        if _all_processes_agree(ok):
            for bad in skipped:
                bad.moved_to = set_aside(checkpoints.directory, bad.step)
            if skipped:  # every process forgets the steps process 0 just moved, or their
                _sync("tpupod-set-aside")  # next saves would disagree on what exists
                _forget_listings(checkpoints.directory)
                checkpoints.manager.reload()
            else:  # nothing failed, so no read is left in flight to quiet
                sys.unraisablehook = previous_hook
            return step, state, data_iter, skipped
        skipped.append(Unreadable(step, file, reason))
    listed = "; ".join(f"step {b.step} ({b.file}: {b.reason})" for b in skipped)
    raise NoReadableStep(
        f"no readable checkpoint in {checkpoints.directory}: {listed}; nothing was moved or "
        "deleted: inspect or remove those steps, or start over with a new --workdir"
    )


def set_aside(directory: str, step: int) -> str | None:
    """Renames `<directory>/<step>` to `<step>.unreadable-<UTC time>` (process 0 only); returns
    the new name, or None when it stayed in place (then said on stderr)."""
    if jax.process_index() != 0:
        return None
    src = storage.join(directory, str(step))
    dst = aside_name(src)
    try:
        if storage.is_remote(src):
            _copy_verified_then_delete(src, dst)
        else:
            os.rename(src, dst)
    except Exception as e:  # noqa: BLE001 - left in place is safe: the next start skips it again
        print(f"warning: could not move step {step} aside ({e}); left in place", file=sys.stderr)
        return None
    return dst.rsplit("/", 1)[-1]


def _listing(fs, root: str) -> dict[str, tuple]:
    found = fs.find(root, detail=True)
    base = fs._strip_protocol(root).rstrip("/") + "/"
    return {k.removeprefix(base): (int(v["size"]), v.get("crc32c")) for k, v in found.items()}


def _copy_verified_then_delete(src: str, dst: str) -> None:
    fs = storage.fs(src)
    before = _listing(fs, src)
    for rel in before:
        fs.copy(f"{src}/{rel}", f"{dst}/{rel}")
    fs.invalidate_cache()
    after = _listing(fs, dst)
    if after != before:
        raise RuntimeError(f"the copy at {dst} differs from {src}; the source was kept")
    fs.rm(src, recursive=True)
