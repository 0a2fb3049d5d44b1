"""The local tier: each process's own copy of recent steps on its VM's disk, for restarts on the
same VMs (a crash, a hang, `tpupod restart`, a rollout), which then read no bucket at all. The
built-in trainer uses it (trainer/steps.py), and any JAX job may (`tpupod_job.open_local_tier`):

    tier = tpupod_job.open_local_tier(every=10)     # None outside tpupod
    step = tier.agreed_step(manager.latest_step()) if tier else None   # on every process
    if step is not None and (found := tier.restore(step, abstract_state)) is not None:
        state, extra = found                        # else: the bucket's manager, as before
    ...
    if tier and tier.due(step):
        tier.save(step, state, extra=data_iterator_state_bytes)

Every `every` steps each process dispatches a copy of the shards it holds of the state (any
pytree of jax.Arrays) to host memory (the only part the loop waits for: the dispatch, not the
step still computing them) and a thread awaits it and writes them, with
the caller's `extra` bytes (the built-in trainer: its data iterator's state), to
`$TPUPOD_LOCAL_CHECKPOINT_DIR/<step>/` (a temporary directory renamed once complete, with a
manifest of sizes and CRC32s). A save still being written when the next comes
due is skipped, never waited for. At a start every process lists the steps it holds that verify;
the newest step that every process holds, if it is not older than the bucket's newest committed
step, is restored from the local copies, and only if every process read its own (else all take
the bucket's path: a recreated slice has empty disks). The persistent tier (Orbax to
`$TPUPOD_CHECKPOINT_DIR`) is unchanged and remains what a recreate, a preemption and the final
step rely on.

Why not Orbax's emergency managers (0.12.8, tried for issue 50): `emergency.CheckpointManager`
drops the local directory with one replica, its multi-slice manager asserts two or more
replicas, its replicator needs GKE, and `emergency.p2p.CheckpointManager` with one host's local
step missing answered `latest_step()` None on every host and then hung in an explicit restore.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import zlib
from pathlib import Path

import jax
import numpy as np

from tpupod_job.host_copy import to_host
from tpupod_job.worker import Worker

ARRAYS, DATA, MANIFEST = "arrays.bin", "data.bin", "manifest.json"
KEEP = 2  # steps kept on disk: the newest, and the one before while the newest is written
OFFERED = 8  # newest verified steps each process offers when all agree on one


def _key(path, index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    bounds = ",".join("{}:{}".format(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))
    return f"{jax.tree_util.keystr(path)}[{bounds}]"


def _shards(pieces) -> dict[str, np.ndarray]:
    """This process's shards, `(key, copy)` each, read from their host copies (awaited here)."""
    return {key: np.asarray(copy) for key, copy in pieces}


def _crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


class LocalTier:
    def __init__(self, directory: str, every: int, identity: dict):
        self.root = Path(directory)
        self.every = every
        # what a copy must match (process count and id, shapes), as its manifest will hold it
        # (JSON: a tuple given here is a list there)
        self.identity = json.loads(json.dumps(identity))
        self.root.mkdir(parents=True, exist_ok=True)
        for left in self.root.glob("*.tmp"):  # a save cut off by a kill
            shutil.rmtree(left, ignore_errors=True)
        self._writer = Worker("local-checkpoint")
        self._plan: tuple | None = None  # (signature, keys, where): LocalTier._shard_plan
        self.saved: int | None = None  # the newest step written whole
        self.skipped = 0  # saves due while the previous one was still being written
        self.blocked_s = 0.0  # the caller's time in save(): what the tier costs its loop

    @classmethod
    def open(cls, directory: str, every: int, identity: dict) -> LocalTier | None:
        """The tier, or None (one warning) where its directory cannot be made: the run goes on
        with the bucket's tier alone."""
        try:
            return cls(directory, every, identity)
        except OSError as err:
            print(f"warning: no local checkpoints ({directory}: {err}); restarts read the "
                  "bucket", file=sys.stderr, flush=True)  # fmt: skip
            return None

    # -- saving -----------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def save(self, step: int, state, extra: bytes = b"") -> bool:
        """Dispatches the copy of this process's shards to host memory (tpupod_job.host_copy:
        the loop does not wait for the step still computing them); the writer thread awaits it
        and writes the shards with `extra`. False when the previous save is still being written
        (this one is skipped)."""
        if self._writer.busy():
            self.skipped += 1
            return False
        t0 = time.perf_counter()
        leaves, treedef = jax.tree.flatten(state)
        keys, where = self._shard_plan(state, leaves, treedef)
        shards = to_host([leaves[i].addressable_data(at) for i, at in where])
        pieces = list(zip(keys, shards, strict=True))
        handed = self._writer.submit(self._write, step, pieces, bytes(extra))
        self.blocked_s += time.perf_counter() - t0
        self.skipped += not handed  # another thread's save got there first
        return handed

    def _shard_plan(self, state, leaves, treedef) -> tuple[list[str], list[tuple[int, int]]]:
        """Which shards this process writes, once each (a replicated index once): their keys
        and (leaf, position among the leaf's addressable shards). Worked out again only when the
        tree, a shape or a sharding changes: walking every shard's index at each save cost the
        loop ~2 ms of a ~8 ms save (two `tiny` processes on two cores)."""
        signature = (treedef, tuple((leaf.shape, leaf.sharding) for leaf in leaves))
        if self._plan is None or self._plan[0] != signature:
            paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
            wanted: dict[str, tuple[int, int]] = {}
            for i, (path, leaf) in enumerate(zip(paths, leaves, strict=True)):
                for at, shard in enumerate(leaf.addressable_shards):
                    wanted.setdefault(_key(path, shard.index, leaf.shape), (i, at))
            self._plan = (signature, list(wanted), list(wanted.values()))
        return self._plan[1], self._plan[2]

    def _write(self, step: int, pieces, data: bytes) -> None:
        """On the writer thread. A disk that refuses (full, gone) costs this copy only: one
        warning, and the bucket's tier carries on."""
        try:
            self._write_step(step, _shards(pieces), data)
        except OSError as err:
            shutil.rmtree(self.root / f"{step}.tmp", ignore_errors=True)
            print(f"warning: local checkpoint step {step} not written ({err}); the bucket's "
                  "checkpoints go on", file=sys.stderr, flush=True)  # fmt: skip

    def _write_step(self, step: int, shards: dict[str, np.ndarray], data: bytes) -> None:
        final, tmp = self.root / str(step), self.root / f"{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        index, offset = {}, 0
        with open(tmp / ARRAYS, "wb") as f:
            for key, array in shards.items():
                raw = np.ascontiguousarray(array).tobytes()
                f.write(raw)
                index[key] = [offset, len(raw)]
                offset += len(raw)
        (tmp / DATA).write_bytes(data)
        files = {name: {"bytes": (tmp / name).stat().st_size, "crc32": _crc(tmp / name)}
                 for name in (ARRAYS, DATA)}  # fmt: skip
        doc = {"step": step, **self.identity, "files": files, "index": index}
        (tmp / MANIFEST).write_text(json.dumps(doc))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        self.saved = step
        for old in self.steps()[:-KEEP]:
            shutil.rmtree(self.root / str(old), ignore_errors=True)

    def wait(self) -> None:
        self._writer.join()

    # -- restoring --------------------------------------------------------------------------
    def steps(self) -> list[int]:
        return sorted(int(p.name) for p in self.root.iterdir() if p.name.isdigit())

    def verified(self, step: int) -> dict | None:
        """The step's manifest if its files are whole and it is this run's and process's."""
        where = self.root / str(step)
        try:
            doc = json.loads((where / MANIFEST).read_text())
            if any(doc.get(k) != v for k, v in self.identity.items()) or doc["step"] != step:
                return None
            for name, want in doc["files"].items():
                path = where / name
                if path.stat().st_size != want["bytes"] or _crc(path) != want["crc32"]:
                    return None
            return doc
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def agreed_step(self, persistent: int | None) -> int | None:
        """The newest step every process holds and verified, if not older than the persistent
        tier's newest (`persistent`); None otherwise. Every process must call it."""
        mine = [s for s in reversed(self.steps()) if self.verified(s)][:OFFERED]
        offered = np.full(OFFERED, -1, np.int64)
        offered[: len(mine)] = mine
        everyone = _gather(offered)
        common = set(everyone[0].tolist())
        for row in everyone[1:]:
            common &= set(row.tolist())
        common.discard(-1)
        best = max(common, default=None)
        return best if best is not None and best >= (persistent or 0) else None

    def restore(self, step: int, abstract_state) -> tuple | None:
        """(state, extra) from this process's copy of `step` (`abstract_state`: the state's
        shapes, dtypes and shardings), or None where it cannot be read; every process learns
        whether all of them could (None for all otherwise). Every process must call it."""
        try:
            state = self._read(step, abstract_state)
            data = (self.root / str(step) / DATA).read_bytes()
            ok = True
        except (OSError, ValueError, KeyError) as err:
            print(f"warning: local checkpoint step {step} unreadable here ({err}); "
                  "restoring from the bucket", file=sys.stderr, flush=True)  # fmt: skip
            ok = False
        if not bool(np.all(_gather(np.array([int(ok)], np.int64)))):
            return None
        import tpupod_job  # its progress() tells the watcher where the resume started

        tpupod_job._restored_from, tpupod_job._restored_tier = step, "local"
        return state, data

    def _read(self, step: int, abstract_state):
        doc = self.verified(step)
        if doc is None:
            raise ValueError("its files no longer match its manifest")
        raw = np.memmap(self.root / str(step) / ARRAYS, dtype=np.uint8, mode="r")
        index = doc["index"]

        def leaf(path, abstract):
            sharding = abstract.sharding
            buffers = []
            for device, idx in sharding.addressable_devices_indices_map(abstract.shape).items():
                offset, size = index[_key(path, idx, abstract.shape)]
                shape = tuple(len(range(*s.indices(n))) for s, n in zip(idx, abstract.shape,
                                                                       strict=True))  # fmt: skip
                host = np.array(raw[offset : offset + size]).view(abstract.dtype).reshape(shape)
                buffers.append(jax.device_put(host, device))
            return jax.make_array_from_single_device_arrays(abstract.shape, sharding, buffers)

        return jax.tree_util.tree_map_with_path(leaf, abstract_state)


def _gather(values: np.ndarray) -> np.ndarray:
    """Every process's `values`, one row each (one process: its own)."""
    if jax.process_count() == 1:
        return values[None]
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(values))


def open_here(every: int, **identity) -> LocalTier | None:
    """The tier at `$TPUPOD_LOCAL_CHECKPOINT_DIR` (None outside tpupod, or with `every` 0), its
    copies this process's and this run's only: `identity` (e.g. the state's shapes) is checked
    with the process's index and count and the run's bucket directory before a copy is used."""
    directory = os.environ.get("TPUPOD_LOCAL_CHECKPOINT_DIR")
    if not directory or every <= 0:
        return None
    who = {"process_index": jax.process_index(), "processes": jax.process_count(),
           "checkpoint_dir": os.environ.get("TPUPOD_CHECKPOINT_DIR", "")}  # fmt: skip
    return LocalTier.open(directory, every, {**who, **identity})
