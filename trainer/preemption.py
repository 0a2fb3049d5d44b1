"""The preemption notice as the trainer's loop sees it: the step every process stops at."""

from __future__ import annotations

import signal
import threading

from trainer.checkpoint import Checkpoints


class Preemption:
    """Has every process reached the agreed preemption step?

    Multi-process: JAX's preemption notifier catches SIGTERM after `jax.distributed.initialize`
    and the sync manager makes all processes answer True at the same step. Single process: no
    notifier exists, so our own SIGTERM handler raises a flag checked at the next step.
    """

    def __init__(self, distributed: bool):
        self.distributed = distributed
        self._flag = threading.Event()
        if not distributed:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        # A second SIGTERM changes nothing: the save in flight goes on (Orbax commits atomically).
        self._flag.set()

    def reached(self, step: int, checkpoints: Checkpoints) -> bool:
        if self.distributed:
            return checkpoints.manager.reached_preemption(step)
        return self._flag.is_set()

    @property
    def noticed(self) -> bool:
        return self._flag.is_set()
