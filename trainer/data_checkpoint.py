"""The `data` item of a checkpoint (every process's grain iterator state), written off the loop.

grain's own CheckpointHandler is synchronous, so Orbax writes it inside the blocking part of an
async save: the training loop waits for one file write per process on every save (on GCS, a
round trip). This handler takes the state at save time, on the loop, and lets
grain's handler write that snapshot in Orbax's background commit, once the step's directory
exists. Files, names and restore stay grain's (`process_<i>-of-<n>.json`), so checkpoints written
before or after read alike, with this handler or grain's (the step metadata names this handler).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import grain
import orbax.checkpoint as ocp
from orbax.checkpoint import future


class _Frozen:
    """An iterator's state as it was when the save began: grain's handler writes `get_state()`
    of any iterator that is not a DatasetIterator as-is (bytes)."""

    def __init__(self, state: bytes):
        self._state = state

    def get_state(self) -> bytes:
        return self._state


def frozen(iterator) -> _Frozen:
    """The state now, in the bytes grain's handler would write for `iterator` (a frozen one as it
    is: Checkpoints.save freezes it on the loop, the handler's save is handed that)."""
    if isinstance(iterator, _Frozen):
        return iterator
    if isinstance(iterator, grain.DatasetIterator):
        return _Frozen(json.dumps(iterator.get_state(), indent=4).encode())
    return _Frozen(iterator.get_state())


class IteratorHandler(ocp.AsyncCheckpointHandler):
    """grain's iterator handler with an asynchronous save (the format is grain's)."""

    def __init__(self):
        self._grain = grain.checkpoint.CheckpointHandler()

    async def async_save(self, directory, args: IteratorSave) -> list[future.Future]:
        snapshot = frozen(args.item)  # now: the loop moves the iterator on at the next step

        async def write() -> None:
            await asyncio.to_thread(self._grain.save, directory, item=snapshot)

        return [future.CommitFutureAwaitingContractedSignals(write(), name="data_iterator_save")]

    def save(self, directory, args: IteratorSave) -> None:
        self._grain.save(directory, item=frozen(args.item))

    def restore(self, directory, args: IteratorRestore):
        return self._grain.restore(directory, args=args)

    def metadata(self, directory) -> Any:
        return self._grain.metadata(directory)

    def finalize(self, directory) -> None:
        self._grain.finalize(directory)

    def close(self) -> None:
        self._grain.close()


@ocp.args.register_with_handler(IteratorHandler, for_save=True)
@dataclasses.dataclass
class IteratorSave(ocp.args.CheckpointArgs):
    item: Any


@ocp.args.register_with_handler(IteratorHandler, for_restore=True)
@dataclasses.dataclass
class IteratorRestore(ocp.args.CheckpointArgs):
    item: Any


def set_state(data_iter, data: bytes):
    """The iterator, set to a state `frozen(data_iter).get_state()` gave (a local copy's)."""
    if isinstance(data_iter, grain.DatasetIterator):
        data_iter.set_state(json.loads(data))
    else:
        data_iter.set_state(data)
    return data_iter
