"""Orbax checkpoints of (train state, every process's grain iterator, run metadata).

One checkpoint is a Composite: `state` (params, optimizer state, step, RNG; restored straight
into the target shardings), `data` (one grain iterator state file per process) and `meta` (process
count, the config fields that fix shapes, the state's leaf shapes). Orbax writes each step
into a temporary directory and renames it only once every process has finished, so a step cut
off mid-write is never listed, never restored. Process 0 writes the step's manifest of sizes
and CRC32Cs (trainer/manifest.py), which a restore checks first, after every item has
finished and before Orbax's commit (Orbax's post-finalization hook): a step Orbax lists always
has its manifest, so no kill or stop between the two can leave a committed step unverifiable."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as cm
from orbax.checkpoint._src.handlers.pytree_checkpoint_handler import PyTreeCheckpointHandler
from orbax.checkpoint._src.path import atomicity_defaults
from tpupod_job.host_copy import host_copy

from contract.layout import checkpoint_dir
from trainer import manifest, storage
from trainer.config import BadInput, Config, shape_signature
from trainer.data_checkpoint import IteratorHandler, IteratorRestore, IteratorSave, frozen
from trainer.save_policy import save_policy, time_policy
from trainer.save_start import SaveStarter, orbax_manager
from trainer.tokenizer import identity_of
from trainer.tree_shapes import leaf_shapes, leaves_in, tree_difference, with_leaves


def preservation_policy(cfg: Config):
    """The latest K, plus every M-th step."""
    policies = [cm.LatestN(cfg.keep_latest)]
    if cfg.keep_every > 0:
        policies.append(cm.EveryNSteps(cfg.keep_every))
    return cm.AnyPreservationPolicy(policies)


def state_handler(use_ocdbt: bool, compression: bool) -> ocp.StandardCheckpointHandler:
    """Orbax's StandardCheckpointHandler (its restore into the target shardings, its checks),
    with zstd on the chunks a choice. It has no such option: it hands every call to the PyTree
    handler in `_impl`, which compresses unless told not to, so that delegate is built here.
    Orbax maps args to handlers by exact class, hence an instance, not a subclass (test:
    tests/trainer/test_checkpoint_compression.py reads the compressor back)."""
    handler = ocp.StandardCheckpointHandler(use_ocdbt=use_ocdbt)
    handler._impl = PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_compression=compression)
    return handler


class Checkpoints:
    def __init__(self, workdir: str, cfg: Config, process_count: int, data: dict | None = None):
        self.directory = checkpoint_dir(workdir)
        self.meta = {"process_count": process_count, "shapes": shape_signature(cfg)}
        self.keep_every = cfg.keep_every
        # What the run trains on (trainer.data.checkpoint_meta: data URI, tokenizer, config):
        # `sample` decodes with it, and a resume refuses data of another tokenizer.
        self.meta.update(data or {})
        self.asynchronous = cfg.checkpoint_async
        # Steps whose save is in flight on process 0, oldest first: Orbax finishes them in order,
        # and its hook (self._write_manifest) is told nothing of which step it finishes.
        self._manifest_due: deque[int] = deque()
        policy = save_policy(cfg)
        self._time_policy = time_policy(policy)  # told of every start (trainer.save_policy)
        options = ocp.CheckpointManagerOptions(
            save_decision_policy=policy,
            preservation_policy=preservation_policy(cfg),
            # Orbax's hook between the finished items and the commit exists only for async
            # saves: a synchronous one (checkpoint_async=false) is an async save waited for.
            enable_async_checkpointing=True,
            # The step's directories are made before its writes start, in the thread that
            # starts it (the loop's only for a preemption or final save): no signals between
            # Orbax's threads, keyed by its process-wide operation counter, to go astray.
            async_options=ocp.AsyncOptions(
                post_finalization_callback=self._write_manifest,
                create_directories_asynchronously=False,
            ),
            # Old steps are deleted on a thread of their own, after the new step has committed:
            # a save (a preemption save above all) never waits for hundreds of object deletes.
            enable_background_delete=True,
            cleanup_tmp_directories=True,
            create=True,
        )
        # The format only decides how new steps are written: Orbax reads each step in the format
        # it was written in (a step's own metadata says whether it is OCDBT).
        use_ocdbt = cfg.checkpoint_format == "ocdbt"
        self.manager = orbax_manager(
            self.directory,
            options,
            process_count,
            item_handlers={
                "state": state_handler(use_ocdbt, cfg.checkpoint_compression),
                "data": IteratorHandler(),  # grain's files, written off the loop
                "meta": ocp.JsonCheckpointHandler(),
            },
        )
        self.committed: int | None = self.manager.latest_step()
        self._pending: int | None = None
        self._said_behind = False
        self.behind: dict | None = None  # set once: the first save that found one in flight
        self.deferred = 0  # periodic saves that came due while the previous one still wrote
        self._deferred_from: int | None = None  # the first step of a save deferred, not yet taken
        self.waited_behind_s = 0.0  # the longest periodic save() that found the previous writing
        self.verify_s = 0.0  # the restore's manifest checks (trainer/restore.py)
        self._starter = SaveStarter()  # periodic saves start on its thread (trainer.save_start)
        self._lock = threading.Lock()  # `_pending` and `committed`: the loop's and the starter's

    def step_dir(self, step: int) -> str:
        return storage.join(self.directory, str(step))

    def check_compatible(self, step: int, abstract_state) -> None:
        """Refuses, as bad input and before touching anything, a checkpoint this run can't use:
        another process count, another tokenizer, other config shapes, or a state tree of other
        leaves or shapes (a trainer version that names or lays out parameters differently)."""
        restored = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        meta = restored["meta"]
        where = f"checkpoint step {step} in {self.directory}"
        if meta.get("process_count") != self.meta["process_count"]:
            raise BadInput(
                f"{where} was written by {meta.get('process_count')} processes, this run has "
                f"{self.meta['process_count']} (the data iterator state needs the same count)"
            )
        trained, now = identity_of(meta.get("tokenizer")), identity_of(self.meta.get("tokenizer"))
        if trained != now:
            raise BadInput(
                f"{where} was trained with tokenizer {trained[:12]} (data "
                f"{meta.get('data', 'byte-level')}), this run's data {self.meta.get('data')} has "
                f"tokenizer {now[:12]}: resume with the data it trained on, or use a new --workdir"
            )
        if meta.get("shapes") != self.meta["shapes"]:
            raise BadInput(
                f"{where} has model shapes {meta.get('shapes')}, this config has "
                f"{self.meta['shapes']}"
            )
        stored = leaves_in(meta) or leaf_shapes(self.manager.item_metadata(step)["state"])
        expected = leaf_shapes(abstract_state)
        if stored != expected:
            raise BadInput(f"{where} {tree_difference(stored, expected)}: it was written by "
                           "another trainer version; use a new --workdir, or resume with the "
                           "tpupod version that wrote it")  # fmt: skip

    def restore(self, step: int, abstract_state, data_iter):
        """Restores state into the shardings carried by `abstract_state`, and the iterator."""
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                data=IteratorRestore(data_iter),
            ),
        )
        return restored["state"], restored["data"]

    def should_save(self, step: int) -> bool:
        """A periodic save is due and the previous one has finished writing. One that comes due
        while the previous still writes is deferred, never waited for: the loop keeps stepping and
        the save is taken at the first step after the writer is free (coalesced: one save for all
        that came due meanwhile; `deferred` counts them). Every process decides alike (the busy
        flag is gathered), so Orbax's collective save starts on all of them or on none.
        Preemption and final saves do not come through here: they are never deferred, and
        neither is a step that `keep_every` keeps for good: a coalesced save lands off the grid,
        and the step that retention promises would never exist (it waits for the writer)."""
        due = self.manager.should_save(step)
        if not due and self._deferred_from is None:
            return False
        if due and self.keep_every > 0 and step % self.keep_every == 0:
            self._deferred_from = None
            return True
        if self._writer_busy():
            self.deferred += int(due)
            if self._deferred_from is None:
                self._deferred_from = step
                if not self._said_behind:
                    self._said_behind = True
                    self.behind = {"step": step, "in_flight": self._pending, "waited_s": 0.0,
                                   "deferred": True}  # fmt: skip
            return False
        self._deferred_from = None
        return True

    def _writer_busy_here(self) -> bool:
        """This process's saver is busy: a start under way, or a save still writing."""
        return self._starter.busy() or (
            self._pending is not None and self.manager.is_saving_in_progress()
        )

    def _writer_busy(self) -> bool:
        busy = self._writer_busy_here()
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            busy = bool(np.any(multihost_utils.process_allgather(np.int32(busy))))
        return busy

    def save(self, step: int, state, data_iter, periodic: bool = False) -> None:
        """Starts a save. A periodic one (async) costs the loop the dispatch of the state's host
        copy: a thread awaits it and starts Orbax's save (trainer.save_start). Any other starts
        here, once a periodic one still starting has. Orbax first waits for the previous save, so
        that one counts as committed from then on (else saves closer than the polls would never
        show in `committed`). `waited_behind_s`: the longest save() behind a previous one."""
        t0 = time.perf_counter()
        behind = self._writer_busy_here()
        if self._time_policy is not None:
            self._time_policy.started()
        data = frozen(data_iter)  # now: the loop moves the iterator on at the next step
        if periodic and self.asynchronous:
            self._starter.start(self._start_copied, step, host_copy(state), data)
        else:
            self._starter.join() if periodic else self._settle(step)
            self._start(step, state, data)
        waited = time.perf_counter() - t0
        if behind and periodic:
            self.waited_behind_s = max(self.waited_behind_s, waited)
        if behind and not self._said_behind:
            self._said_behind = True
            self.behind = {"step": step, "in_flight": self._pending, "waited_s": round(waited, 3)}
        if not self.asynchronous:
            self.wait()

    def _settle(self, step: int) -> None:
        """Before a preemption's or the final save: every earlier save has finished. One that
        failed is reported and superseded, not raised: this save is the one that must commit."""
        try:
            self._starter.join()
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - reported; the step in hand still saves
            print(f"warning: an earlier checkpoint save failed ({type(e).__name__}: {e}); "
                  f"saving step {step} anyway", file=sys.stderr, flush=True)  # fmt: skip
            with self._lock:
                self._pending = None  # never committed
        self._manifest_due.clear()  # a failed save's step would take this one's manifest

    def _start_copied(self, step: int, copies, data) -> None:
        """On the starter's thread: the host copy the loop dispatched, once it is done."""
        self._start(step, jax.block_until_ready(copies), data)

    def _start(self, step: int, state, data) -> None:
        """Orbax's save of `step`, on the loop or on the starter's thread."""
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=IteratorSave(data),
            meta=ocp.args.JsonSave(with_leaves(self.meta, state)),
        )
        if jax.process_index() == 0:
            self._manifest_due.append(step)
        started = False
        try:
            started = self.manager.save(step, args=args, force=True)
        finally:
            if not started and step in self._manifest_due:
                self._manifest_due.remove(step)  # nothing written, so no hook for it either
        with self._lock:
            if self._pending is not None:
                self._commit(self._pending)
            self._pending = step

    def _write_manifest(self) -> None:
        """Orbax's post-finalization hook, on process 0's save thread: every item of the oldest
        step in flight is written and finalized, and Orbax commits it (renames its temporary
        directory, or writes its commit file on GCS) only once this returns. If this raises,
        the step never commits."""
        step = self._manifest_due.popleft()
        final = epath.Path(self.step_dir(step))
        path_class = atomicity_defaults.get_default_temporary_path_class(final.parent)
        writing = str(path_class.from_final(final).get())
        manifest.write(writing, step)

    def _commit(self, step: int) -> None:
        """A save has finished: Orbax committed it, and so its manifest is there (written before
        the commit), on every process alike."""
        self.committed = step

    def poll(self) -> int | None:
        """The last committed step (an async save: once finished, with its manifest). A failed
        start, write or commit raises here (Orbax clears its flag either way: its finalize
        thread, asked only while no start is under way, tells a commit from a failure)."""
        with self._lock:
            idle = not self._starter.busy() and not self.manager.is_saving_in_progress()
            if self._pending is not None and idle:
                self.manager.wait_until_finished()  # raises the failed save's error
                step, self._pending = self._pending, None
                self._commit(step)
        self._starter.check()
        return self.committed

    def wait(self) -> int | None:
        self._starter.join()
        self.manager.wait_until_finished()
        return self.poll()

    def close(self) -> None:
        """Joins the deleter of old steps. Call it after reporting the commit: if the deadline
        kills us here, a pruned step is left half deleted, never the newest one."""
        self._starter.join()
        self.manager.close()
