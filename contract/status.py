"""The status file (`$TPUPOD_STATUS_FILE`), the job -> ops seam, defined once: the states a job
may name, the fields a writer fills (StatusReport), and the file as the watcher reads it
(JobStatus: the same fields, read permissively).

Read permissively, since many writers fill it: the built-in trainer (every field, a heartbeat
from a thread: trainer/status.py writes these names), `tpupod_job.progress()` (`step`, `time`,
metrics), the worker's launcher for `progress: {regex}` (`step`, `time`), or any program that
writes JSON with at least `step`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum


class JobState(StrEnum):
    """What a job says it is doing (the built-in trainer names each; a job that names none is
    training)."""

    INITIALIZING = "initializing"
    RESTORING = "restoring"  # finding, verifying and reading the newest committed checkpoint
    COMPILING = "compiling"
    TRAINING = "training"
    SAVING = "saving"
    PREEMPTED = "preempted"
    DONE = "done"
    FAILED = "failed"


# A job (re)starting: its first step may take the startup allowance.
STARTING_STATES = (JobState.INITIALIZING, JobState.RESTORING, JobState.COMPILING)
# A restarted job that reports one of these has resumed.
RESUMED_STATES = (JobState.TRAINING, JobState.SAVING, JobState.DONE)


@dataclass
class StatusReport:
    """The status file's fields as a writer that names every one writes them (the built-in
    trainer: trainer.status.StatusFile); any other job may write a subset with at least `step`."""

    state: str = JobState.INITIALIZING
    step: int = 0
    loss: float | None = None
    tokens_per_s: float | None = None
    last_checkpoint: int | None = None
    # The newest step this process's local tier holds whole (tpupod_job.local_tier): progress a
    # restart on the same VMs keeps, so it ends a crash loop's streak as a bucket commit does.
    local_checkpoint: int | None = None
    # Seconds this process's loop spent in the local tier's saves since it started (they keep
    # the state `training`): the goodput breakdown counts them as checkpoint save (bench.badput).
    local_save_s: float | None = None
    restored_from: int | None = None
    # Where `restored_from` was read: "local" (this VM's own copy: the local tier) or
    # "persistent" (the bucket); None for a fresh start or a writer that does not say.
    restored_tier: str | None = None
    compile_cache_hit: bool | None = None
    exit_code: int | None = None
    message: str | None = None
    # Committed steps this start could not read and set aside: {step, restored, moved_to, line}
    # (the watcher journals them once per process; `message` says the same to a person).
    fallbacks: list[dict] = field(default_factory=list)
    process_id: int = 0
    pid: int | None = None
    heartbeat: float | None = None  # a beat its writer keeps up between steps (the trainer's)


@dataclass
class JobStatus(StatusReport):
    """The status file as the watcher reads it (parse_status): what any writer put there."""

    state: str = JobState.TRAINING  # a job that names no state is training
    updated: float = 0.0  # when the writer last wrote: heartbeat, else `time`, else the mtime
    attempt: int | None = None


def parse_status(text: str, mtime: float | None = None) -> JobStatus | None:
    """None for a file that is torn, not JSON, or has no integer `step`."""
    try:
        raw = json.loads(text)
        step = raw["step"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    heartbeat = _number(raw.get("heartbeat"))
    updated = heartbeat or _number(raw.get("time")) or mtime or 0.0
    return JobStatus(
        step=step,
        state=str(raw.get("state") or "training"),
        updated=updated,
        heartbeat=heartbeat,
        loss=_number(raw.get("loss")),
        tokens_per_s=_number(raw.get("tokens_per_s")),
        last_checkpoint=_integer(raw.get("last_checkpoint")),
        local_checkpoint=_integer(raw.get("local_checkpoint")),
        restored_from=_integer(raw.get("restored_from")),
        restored_tier=raw.get("restored_tier")
        if isinstance(raw.get("restored_tier"), str)
        else None,
        compile_cache_hit=raw.get("compile_cache_hit"),
        exit_code=_integer(raw.get("exit_code")),
        message=raw.get("message") if isinstance(raw.get("message"), str) else None,
        pid=_integer(raw.get("pid")),
        attempt=_integer(raw.get("attempt")),
        fallbacks=_records(raw.get("fallbacks")),
    )


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _records(value) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _integer(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
