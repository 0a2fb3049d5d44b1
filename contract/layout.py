"""A run directory's layout (`TPUPOD_RUN_DIR`, `gs://BUCKET/runs/<stack>/<run id>`), spelled
once for Python: the job's checkpoints (`checkpoints/<step>/`) and each attempt's output per worker
(`tpupod/attempt-<N>/worker-<I>.log`). A path or a gs://
URI alike (joined with "/"); a prefix inside the bucket too.

The worker's shell (bootstrap/startup.sh) keeps its own literal for `TPUPOD_CHECKPOINT_DIR`;
tests/contract/test_layout.py checks it against this module.
"""

from __future__ import annotations

CHECKPOINTS = "checkpoints"
OUTPUT = "tpupod"  # tpupod's own files in the run directory: each attempt's output
LOCAL_CHECKPOINTS = "local-checkpoints"  # under a worker's TPUPOD_ROOT: the local tier


def checkpoint_dir(run_dir: str) -> str:
    """Where the job's checkpoints go: `TPUPOD_CHECKPOINT_DIR`, one directory per step."""
    return f"{run_dir.rstrip('/')}/{CHECKPOINTS}" if run_dir else CHECKPOINTS


def local_checkpoint_dir(tpupod_root: str, run_id: str) -> str:
    """`TPUPOD_LOCAL_CHECKPOINT_DIR`: the local tier of run `run_id` on one worker's own disk
    (tpupod_job.local_tier); a recreated VM has an empty one."""
    return f"{str(tpupod_root).rstrip('/')}/{LOCAL_CHECKPOINTS}/{run_id}"


def attempt_dir(run_dir: str, attempt: int | str) -> str:
    """Attempt `attempt`'s output, one log per worker (a preempted VM's disk is gone)."""
    return f"{run_dir.rstrip('/')}/{OUTPUT}/attempt-{attempt}"


def attempt_log(run_dir: str, attempt: int | str, worker: int | str) -> str:
    return f"{attempt_dir(run_dir, attempt)}/worker-{worker}.log"


def local_attempt_log(name: str, attempt: int | str) -> str:
    """The worker's own copy of an attempt's output, under its state directory (`job`, or
    `reference` for the demo's uninterrupted run): what `tpupod logs` tails."""
    return f"logs/{name}-attempt-{attempt}.log"
