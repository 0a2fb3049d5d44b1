"""`python -m trainer`: flags (with TPUPOD_* environment equivalents, docs/seams.md), multi-host
initialisation, compilation cache, and the exit-code contract: bad input is one line on stderr
and exit 2, never a traceback.

Start-up is timed by events (process 0): `started` before the heavy imports (with the process's
own start time), `jax_initialized` once JAX's distributed runtime and backend are up.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from trainer import allocator, events

ENV = {
    "workdir": "TPUPOD_WORKDIR",
    "run_dir": "TPUPOD_RUN_DIR",  # the job contract's run directory: the workdir under tpupod
    "coordinator": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "TPUPOD_NUM_PROCESSES",
    "process_id": "TPUPOD_PROCESS_ID",
    "status_file": "TPUPOD_STATUS_FILE",
    "compile_cache": "TPUPOD_COMPILE_CACHE",
    "init_timeout": "TPUPOD_INIT_TIMEOUT",
    "max_loss_s": "TPUPOD_MAX_LOSS_S",
    "local_checkpoint_dir": "TPUPOD_LOCAL_CHECKPOINT_DIR",
}


def _config_help() -> str:
    from trainer.config import FIELDS, PRESETS

    keys = ", ".join(f"{name} ({f.type})" for name, f in FIELDS.items())
    return f"presets: {', '.join(PRESETS)}\n--set keys: {keys}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Multi-host JAX language-model trainer with exact resume after preemption. "
        "Exit codes: 0 done, 1 failed, 2 bad input, 75 preempted (checkpoint committed; "
        "restart to resume). `python -m trainer sample --help`: text from a checkpoint.",
        epilog=_config_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    env = os.environ.get
    p.add_argument("--config", required=True, help="preset (tiny, small, 350m, 1b) or a YAML file")
    p.add_argument(
        "--workdir",
        default=env(ENV["workdir"]) or env(ENV["run_dir"]),
        help="run directory, local path or gs://bucket/prefix [$TPUPOD_WORKDIR, $TPUPOD_RUN_DIR]",
    )
    p.add_argument("--steps", type=int, help="total steps to train to (overrides the config)")
    p.add_argument("--seed", type=int, help="seed for init and data order (overrides the config)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config field; repeatable",
    )
    _contract_flags(p)
    return p


def _contract_flags(p: argparse.ArgumentParser) -> None:
    """The flags the job contract's environment fills (docs/seams.md, worker -> job)."""
    env = os.environ.get
    p.add_argument(
        "--coordinator",
        default=env(ENV["coordinator"]),
        help="HOST:PORT of process 0's coordinator [$JAX_COORDINATOR_ADDRESS]",
    )
    p.add_argument(
        "--num-processes",
        type=int,
        default=env(ENV["num_processes"]),
        help="number of processes (hosts) [$TPUPOD_NUM_PROCESSES]",
    )
    p.add_argument(
        "--process-id",
        type=int,
        default=env(ENV["process_id"]),
        help="this process's index [$TPUPOD_PROCESS_ID]",
    )
    p.add_argument(
        "--init-timeout",
        type=int,
        default=env(ENV["init_timeout"], 1800),
        help="jax.distributed.initialize timeout in s [$TPUPOD_INIT_TIMEOUT, 1800]",
    )
    p.add_argument(
        "--status-file",
        default=env(ENV["status_file"]),
        help="this process's JSON status file [$TPUPOD_STATUS_FILE]",
    )
    p.add_argument(
        "--compile-cache",
        default=env(ENV["compile_cache"]),
        help="where each process keeps the compiled train step, local or gs://; 'off' compiles "
        "every start [$TPUPOD_COMPILE_CACHE; default: compile-cache beside the workdir]",
    )
    p.add_argument(
        "--local-checkpoint-dir",
        default=env(ENV["local_checkpoint_dir"]),
        help="this process's own copies of recent steps on local disk (the local tier: a "
        "restart on the same VMs restores from it; config local_checkpoint_every) "
        "[$TPUPOD_LOCAL_CHECKPOINT_DIR; unset: off]",
    )
    p.add_argument(
        "--max-loss-s",
        type=float,
        default=env(ENV["max_loss_s"]),
        help="save at least this often (seconds), whatever the step time, so a preemption "
        "without notice loses at most this much work; bounds checkpoint_every_seconds "
        "[$TPUPOD_MAX_LOSS_S; the job's max_loss_minutes]",
    )


def _start_jax(args) -> bool:
    """JAX started as any job starts it, through tpupod_job.init: the flags become the contract's
    variables it reads. Distributed whenever a coordinator is named (even one process); JAX's
    own cache stays off (trainer/compile_cache.py keeps the compiled step). Returns whether
    jax.distributed started."""
    import tpupod_job

    multi = {"coordinator": args.coordinator, "num_processes": args.num_processes,
             "process_id": args.process_id}  # fmt: skip
    if any(v is None for v in multi.values()) and any(v is not None for v in multi.values()):
        from trainer.config import BadInput

        raise BadInput("--coordinator, --num-processes and --process-id go together")
    distributed = args.coordinator is not None
    if distributed:
        os.environ.update({ENV[k]: str(v) for k, v in multi.items()})
    return tpupod_job.init(args.init_timeout, distributed=distributed, jax_cache=False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sample"]:  # `python -m trainer sample`: generate from a checkpoint
        from trainer.sample import main as sample_main

        return sample_main(argv[1:])
    args = parser().parse_args(argv)
    first = not args.process_id  # process 0 (or the only one): the one that writes stdout
    if first:
        events.event(
            "started",
            process_start=events.process_start_time(),
            promoted_at=events.promoted_at(),  # a standby's: when this attempt began
            pid=os.getpid(),
            allocator=allocator.name(),
        )
    # Cheap checks first, before the heavy imports: bad input fails in well under a second.
    from contract.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED
    from contract.status import JobState
    from trainer.config import BadInput, bound_loss, load_config
    from trainer.status import StatusFile

    hb = None
    try:
        cfg = bound_loss(load_config(args.config, args.set, steps=args.steps, seed=args.seed),
                         args.max_loss_s)  # fmt: skip
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        StatusFile(args.status_file, args.process_id or 0).update(
            state=JobState.FAILED, exit_code=EXIT_BAD_INPUT, message=str(e)
        )
        return EXIT_BAD_INPUT
    from trainer import storage
    from trainer.status import Heartbeat  # jax-free: the status file appears within a second

    try:
        hb = Heartbeat(
            args.status_file, args.process_id or 0, cfg.heartbeat_seconds, cfg.stall_seconds
        )
        hb.update(state=JobState.INITIALIZING)
        return _start_and_train(args, cfg, hb, first)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        if hb is not None:
            hb.update(state=JobState.FAILED, exit_code=EXIT_BAD_INPUT, message=str(e))
        return EXIT_BAD_INPUT
    except storage.Unreachable as e:  # a failure (the watcher retries it), in one line
        print(f"error: {e}", file=sys.stderr, flush=True)
        if hb is not None:
            hb.update(state=JobState.FAILED, exit_code=EXIT_FAILED, message=str(e))
        return EXIT_FAILED
    except Exception as e:  # noqa: BLE001 - report every failure in the status file
        traceback.print_exc()
        if hb is not None:
            hb.update(state=JobState.FAILED, exit_code=EXIT_FAILED, message=repr(e)[:500])
        return EXIT_FAILED
    finally:
        if hb is not None:
            hb.stop()


def _start_and_train(args, cfg, hb, first: bool) -> int:
    """The workdir checked, JAX started (distributed when the contract says so), then the run."""
    from trainer import storage
    from trainer.config import BadInput

    if not args.workdir:
        raise BadInput("--workdir (or $TPUPOD_WORKDIR, $TPUPOD_RUN_DIR) is required")
    workdir = storage.normalize(args.workdir)
    storage.check_writable(workdir, args.process_id or 0)
    # The heavy imports (jax, flax, optax, orbax, grain) all here, so that `jax_initialized`
    # times JAX's start-up alone. None of them starts a backend.
    from trainer import train
    from trainer.config import explicit_keys, with_generation_batch
    from trainer.peak import generation

    t0 = time.perf_counter()
    distributed = _start_jax(args)
    import jax

    backend = jax.default_backend()  # starts the backend (TPU runtime, CPU collectives)
    if first:
        events.event(
            "jax_initialized",
            seconds=round(time.perf_counter() - t0, 3),
            backend=backend,
            distributed=distributed,
            processes=jax.process_count(),
            devices=jax.device_count(),
        )
    cache = args.compile_cache or storage.join(storage.parent(workdir), "compile-cache")
    cfg = with_generation_batch(cfg, generation(jax.devices()[0]))
    explicit_vocab = "vocab_size" in explicit_keys(args.config, args.set)
    return train.run(cfg, workdir, hb, explicit_vocab, None if cache == "off" else cache,
                     args.local_checkpoint_dir)  # fmt: skip
