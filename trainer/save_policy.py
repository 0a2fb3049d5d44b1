"""When the loop saves on its own: every N steps and/or T seconds. The save at the preemption
sync step is the loop's too, at `tpupod_job.should_stop` (trainer.hooks), not Orbax's policy:
the manager never asks JAX about that step (trainer.save_start.QuietPreemptionManager).

The time-based decision (`checkpoint_every_seconds`, the job's max_loss_minutes) is a save
when at least that long has passed since the last one, decided by process 0 and told to the
others under the step's own key in the distributed client's key-value store (one key a step:
process 0 deletes them a block of BLOCK steps at a time, two blocks behind, so a long run does
not grow the coordinator's store without end).

Orbax's ContinuousCheckpointingPolicy does the same under a key numbered by a process-wide
operation counter (OperationIdGenerator), which every save advances too. With a save started
off the loop (trainer.save_start), the loop's decisions and the save's start advance that
counter in different orders on different processes: the keys then differ and a process waits
for a decision nobody writes; in one process the save's own directory signals went to another
operation and it never committed (a run with `--max-loss-s 1` hung at its final save).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import jax
from orbax.checkpoint import checkpoint_managers as cm

TIMEOUT_MS = 300_000  # Orbax's coordination timeout: process 0 is at most a step behind
# Keys are grouped by step // BLOCK. A block is deleted once process 0 decides in the block two
# after it: every process is then >= BLOCK steps past its last key (each step's collectives keep
# the processes within a few steps of each other, and each reads its key before going on).
BLOCK = 1000
PREFIX = "tpupod/time-save"


class AgreedTimePolicy:
    """Orbax's SaveDecisionPolicy protocol: `should_save(step, previous_steps, *, context)`."""

    def __init__(self, seconds: int):
        self.interval = datetime.timedelta(seconds=seconds)
        # The loop's last save start (Checkpoints.save, on every process; process 0's decides).
        # Orbax learns of a save only once its start has passed a barrier and listed the step,
        # a fraction of a second after the loop handed it to the starter's thread: until then
        # neither `previous_steps` nor `is_saving_in_progress` shows it, and the next step would
        # be due again (a second save, counted as deferred, with a false "saves cannot keep
        # up" warning).
        self.last_start: datetime.datetime | None = None
        self.block: int | None = None  # the key block process 0 last wrote in

    def started(self) -> None:
        self.last_start = datetime.datetime.now(tz=datetime.UTC)

    def _due(self, step, previous_steps: Sequence, context) -> bool:
        if context.is_saving_in_progress:
            return False
        last = [t for t in (previous_steps and previous_steps[-1].time, self.last_start) if t]
        return not last or step.time - max(last) >= self.interval

    def should_save(self, step, previous_steps: Sequence, *, context) -> bool:
        if jax.process_count() == 1:
            return self._due(step, previous_steps, context)
        from jax._src import distributed

        client = distributed.global_state.client
        if jax.process_index() == 0:
            due = self._due(step, previous_steps, context)
            self.tell(client, step.step, due)
            return due
        return client.blocking_key_value_get(key(step.step), TIMEOUT_MS) == "1"

    def tell(self, client, step: int, due: bool) -> None:
        """Process 0's decision for `step`, for the others; the block two behind goes."""
        client.key_value_set(key(step), str(int(due)), allow_overwrite=True)
        block = step // BLOCK
        if block != self.block:
            self.block = block
            if block >= 2:
                client.key_value_delete(f"{PREFIX}/{block - 2}")  # a directory: all its keys


def key(step: int) -> str:
    return f"{PREFIX}/{step // BLOCK}/{step}"


def time_policy(policy) -> AgreedTimePolicy | None:
    """The time-based part of `save_policy(cfg)`, if it has one (to tell it of every start)."""
    found = [p for p in getattr(policy, "policies", ()) if isinstance(p, AgreedTimePolicy)]
    return found[0] if found else None


def save_policy(cfg):
    """Every N steps and/or T seconds."""
    policies = []
    if cfg.checkpoint_every > 0:
        policies.append(cm.FixedIntervalPolicy(cfg.checkpoint_every))
    if cfg.checkpoint_every_seconds > 0:
        seconds = max(1, int(cfg.checkpoint_every_seconds))
        policies.append(AgreedTimePolicy(seconds))  # not Orbax's: the module says why
    return cm.AnySavePolicy(policies)
