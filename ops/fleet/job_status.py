"""The job as the watcher judges it: its status file (`$TPUPOD_STATUS_FILE`, the job -> ops
seam) and the rules its spec sets for exits and progress.

The status file is read permissively, since many writers fill it: the built-in trainer (every field, a heartbeat
from a thread), `tpupod_job.progress()` (`step`, `time`, metrics), the worker's launcher for
`progress: {regex}` (`step`, `time`), or any program that writes JSON with at least `step`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# The built-in trainer's states (trainer.status.TrainerState); a job that names none is training.
STARTING_STATES = ("initializing", "restoring", "compiling")
RUNNING_STATES = (*STARTING_STATES, "training", "saving")
RESUMED_STATES = ("training", "saving", "done")


@dataclass
class JobStatus:
    step: int
    state: str = "training"
    updated: float = 0.0  # when the writer last wrote: heartbeat, else `time`, else the mtime
    heartbeat: float | None = None  # a beat its writer keeps up between steps (the trainer's)
    loss: float | None = None
    tokens_per_s: float | None = None
    last_checkpoint: int | None = None
    restored_from: int | None = None
    compile_cache_hit: bool | None = None
    exit_code: int | None = None
    message: str | None = None
    pid: int | None = None
    attempt: int | None = None
    fallbacks: tuple[dict, ...] = ()  # committed steps the job could not read and set aside


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
        restored_from=_integer(raw.get("restored_from")),
        compile_cache_hit=raw.get("compile_cache_hit"),
        exit_code=_integer(raw.get("exit_code")),
        message=raw.get("message") if isinstance(raw.get("message"), str) else None,
        pid=_integer(raw.get("pid")),
        attempt=_integer(raw.get("attempt")),
        fallbacks=_records(raw.get("fallbacks")),
    )


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _records(value) -> tuple[dict, ...]:
    return tuple(v for v in value if isinstance(v, dict)) if isinstance(value, list) else ()


def _integer(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class JobRules:
    """What the job's spec (infra.job.JobSpec) says about its exits and progress."""

    steps: int | None = None  # the done rule: the last progress reached it
    preempted: frozenset[int] = frozenset({75})
    fatal: frozenset[int] = frozenset({2})
    reports_progress: bool = True  # `progress: none`: judged by process liveness alone

    @classmethod
    def of(cls, spec) -> JobRules:
        return cls(
            steps=spec.steps,
            preempted=frozenset(spec.exit_codes.preempted),
            fatal=frozenset(spec.exit_codes.fatal),
            reports_progress=spec.progress != "none",
        )
