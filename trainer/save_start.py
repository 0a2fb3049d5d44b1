"""A periodic save started off the loop, so that the loop pays for the state's copy to host
memory and nothing more (issue 50: saves block no longer than the device-to-host copy).

Orbax's `CheckpointManager.save` blocks its caller for more than that copy: two barriers across
processes, a look at the bucket for the step's directory, a fresh event loop and a thread per
commit future. On the local pod's two `tiny` workers that was ~0.25 s a save (bench
goodput-survive: 3.3 % of the run at a save every 100 steps). The train step donates the state,
so Orbax cannot read it later from another thread: the loop dispatches a copy of it to host
memory (tpupod_job.host_copy, one call for the whole state, never awaited there) and goes on; a
thread waits for that copy and hands it to Orbax, whose own transfer is then host to host.

Three things make Orbax's save safe off the loop's thread: its barriers go through the
distributed client, not `sync_global_devices` (a collective program, which must not run beside
the step's: Orbax's own comments say it may deadlock; `orbax_manager`), Orbax never asks JAX
whether the preemption sync point is reached (`QuietPreemptionManager`: tpupod_job does), and the
time-based save decision keeps off Orbax's process-wide operation counter (trainer.save_policy).
Tests: tests/trainer/test_save_start.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import orbax.checkpoint as ocp
from etils import epath
from tpupod_job.worker import Worker


class SaveStarter:
    """One thread (tpupod_job's Worker, started once) runs a save's start at a time; its error
    is raised on the loop's thread at the next start, join or check, so a failed start stops
    the run as it did on the loop."""

    def __init__(self) -> None:
        self._worker = Worker("tpupod-save-start", on_error=self._keep)
        self._error: BaseException | None = None

    def _keep(self, error: BaseException) -> None:
        self._error = error

    def start(self, fn: Callable[..., None], *args) -> None:
        self.join()
        self._worker.submit(fn, *args)

    def busy(self) -> bool:
        return self._worker.busy()

    def join(self) -> None:
        self._worker.join()
        self.check()

    def check(self) -> None:
        """Raises a finished start's error (once)."""
        if self._error is not None and not self.busy():
            error, self._error = self._error, None
            raise error


class QuietPreemptionManager(ocp.CheckpointManager):
    """Orbax's manager, never asking JAX whether the preemption sync point is reached: the loop
    asks `tpupod_job.should_stop` once a step and saves that step itself (trainer.hooks). JAX's
    sync manager keeps the last step it was asked about as the process's step
    (PreemptionSyncManagerImpl::ReachedSyncPoint sets call_counter_), and a notice agrees on the
    largest such step + 1. Orbax asks about the saved step from other threads too (its finalize
    thread, after the commit; a save started here): that moved the process's step back, and a
    notice arriving then could agree on a step the loop had passed, so that no preemption save
    came."""

    def reached_preemption(self, step: int) -> bool:
        return False


def orbax_manager(directory: str, options: ocp.CheckpointManagerOptions, process_count: int,
                  **kwargs) -> QuietPreemptionManager:  # fmt: skip
    """The manager, its barriers across every process through the distributed client (Orbax
    takes that path when the active processes are named). Orbax then refuses to create the
    root directory itself (`create=True`): process 0 creates it here, the others wait."""
    if process_count > 1:
        from jax.experimental import multihost_utils

        if jax.process_index() == 0:
            epath.Path(directory).mkdir(parents=True, exist_ok=True)
        multihost_utils.sync_global_devices("tpupod:checkpoint-root")
        every = ocp.options.MultiprocessingOptions(active_processes=set(range(process_count)))
        options = dataclasses.replace(options, create=False, multiprocessing_options=every)
    return QuietPreemptionManager(directory, options=options, **kwargs)
