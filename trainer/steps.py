"""A run made ready, then its steps: the data (its tokenizer fixes the vocabulary), mesh, model
and optimizer; the newest readable committed checkpoint restored, or a fresh state; the train
step compiled (or loaded from the cache); then `training_steps`, one `StepInfo` per step, as
Levanter's training loop yields them. What happens around a step (reports, saves, the
preemption check) is trainer.hooks'."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jax
from tpupod_job.local_tier import LocalTier

from contract.status import JobState
from trainer import data
from trainer.checkpoint import Checkpoints
from trainer.compile_cache import agree, compile_program, load_entry
from trainer.config import Config, shape_signature
from trainer.data_checkpoint import set_state
from trainer.metrics import MetricsLog
from trainer.model import count_params
from trainer.restore import restore_newest_readable
from trainer.sharding import Setup, make_mesh
from trainer.status import Heartbeat


@dataclass
class StepInfo:
    step: int  # the step just dispatched
    metrics: Any  # its metrics on the device: read one step late (trainer.hooks.Reporter)


@dataclass
class Run:
    """Everything the loop and its hooks share; `state`, `step` and `data_iter` advance."""

    cfg: Config
    log: MetricsLog
    hb: Heartbeat
    setup: Setup
    checkpoints: Checkpoints
    state: Any
    data_iter: Any
    step: int
    restored_from: int | None
    n_params: int
    train_step: Any = None
    cache_hit: bool | None = None
    local: LocalTier | None = None  # the local tier, when the run has a local directory
    restored_tier: str | None = None  # "local" or "persistent": where the restore came from
    compile_cache: str | None = None  # the run's compile cache (its bucket), shared by its VMs

    @property
    def mesh(self):
        return self.setup.mesh


def prepare(cfg: Config, workdir: str, hb: Heartbeat, explicit_vocab: bool,
            compile_cache: str | None, local_dir: str | None = None) -> Run:  # fmt: skip
    """Steps 1-3 of a run: set up, restore or initialise, compile."""
    log = MetricsLog(workdir, enabled=jax.process_index() == 0)
    cfg, setup, loaded, n_params = set_up(cfg, log, explicit_vocab)
    data_iter = data.make_iterator(cfg, loaded.tokens)
    t_restore = time.perf_counter()
    hb.update(state=JobState.RESTORING)
    checkpoints = Checkpoints(workdir, cfg, jax.process_count(), data.checkpoint_meta(cfg, loaded))
    run = Run(cfg, log, hb, setup, checkpoints, None, data_iter, 0, None, n_params,
              compile_cache=compile_cache)  # fmt: skip
    if local_dir and cfg.local_checkpoint_every > 0:
        identity = {"process_index": jax.process_index(), "workdir": workdir,
                    "shapes": shape_signature(cfg), **checkpoints.meta}  # fmt: skip
        run.local = LocalTier.open(local_dir, cfg.local_checkpoint_every, identity)
    # 3a. The step is lowered and its cached executable read while the state restores: neither
    # needs the other, and on a slice each takes seconds (a bucket's reads; tracing a large
    # model). The thread runs no collective: the processes agree on this one, after the restore.
    with ThreadPoolExecutor(1, thread_name_prefix="lower-step") as ahead:
        lowering = ahead.submit(lower_ahead, setup, compile_cache)
        restore_or_init(run, compile_cache, t_restore)
        restored_at = time.time()
        hb.update(state=JobState.COMPILING, step=run.step, restored_from=run.restored_from,
                  restored_tier=run.restored_tier,
                  last_checkpoint=checkpoints.committed)  # fmt: skip
        t0 = time.perf_counter()  # `compiled` seconds: from the restore's end
        entry, began, ready = lowering.result()
        compiled = agree(entry)
    run.train_step, run.cache_hit = compiled.executable, compiled.hit
    log.event("compiled", seconds=round(time.perf_counter() - t0, 3), compile_cache_hit=run.cache_hit,
              compile_cache=compiled.why, cache_load_s=round(compiled.load_s, 3),
              lowered_beside_restore_s=round(max(0.0, min(ready, restored_at) - began), 3))  # fmt: skip
    return run


def lower_ahead(setup: Setup, compile_cache: str | None):
    """3a, on its thread: the step lowered and this process's cache entry loaded, with when
    that began and ended (the `compiled` event says how much of it ran beside the restore)."""
    began = time.time()
    entry = load_entry(setup.lower_train_step(), setup.mesh.devices.flat, compile_cache)
    return entry, began, time.time()


def set_up(cfg: Config, log: MetricsLog, explicit_vocab: bool):
    """1. The data (its tokenizer fixes the vocabulary), mesh, model, optimizer, shardings."""
    loaded = data.load_source(cfg)
    cfg, vocab_note = data.fit_vocab(cfg, loaded, explicit_vocab)
    if vocab_note and jax.process_index() == 0:
        print(f"note: {vocab_note}", file=sys.stderr, flush=True)
    mesh = make_mesh(cfg)
    setup = Setup(cfg, mesh)
    n_params = count_params(setup.abstract_state["params"])
    log.event(
        "setup",
        params=n_params,
        devices=jax.device_count(),
        processes=jax.process_count(),
        mesh=dict(mesh.shape),
        data=loaded.uri,
        data_tokens=int(len(loaded.tokens)),
        tokenizer=loaded.tokenizer.to_json(),
        vocab_note=vocab_note,
        config=cfg.__dict__,
    )
    return cfg, setup, loaded, n_params


def restore_or_init(run: Run, compile_cache: str | None, t_restore: float) -> None:
    """2. Resume from the latest committed checkpoint, or create a fresh state already sharded.
    A committed step that cannot be read is reported, moved aside, and the one before it used.
    `t_restore`: when the restore began (the manager's own listing counts)."""
    checkpoints, log, hb = run.checkpoints, run.log, run.hb
    if restore_local(run, t_restore):
        return
    restored_from, state, run.data_iter, unreadable = restore_newest_readable(
        checkpoints, run.setup.abstract_state, run.data_iter
    )
    for bad in unreadable:
        line = bad.line(restored_from)
        if jax.process_index() == 0:
            print(f"warning: {line}", file=sys.stderr, flush=True)
        log.event("checkpoint_fallback", step=bad.step, restored=restored_from, file=bad.file,
                  reason=bad.reason, moved_to=bad.moved_to)  # fmt: skip
        record = {"step": bad.step, "restored": restored_from, "moved_to": bad.moved_to,
                  "line": line}  # fmt: skip
        hb.update(message=f"checkpoint_fallback: {line}", fallbacks=[*hb.status.fallbacks, record])
    checkpoints.committed = restored_from
    if restored_from is not None:
        restore_s = round(time.perf_counter() - t_restore, 3)  # listing, checks, every read
        run.restored_tier = "persistent"
        log.event("restored", step=restored_from, directory=checkpoints.directory,
                  seconds=restore_s, verify_s=round(checkpoints.verify_s, 3),
                  tier=run.restored_tier)  # fmt: skip
    else:  # a fresh state; its init program, like the step's, comes from the cache when it can
        t_init = time.perf_counter()
        devices = run.setup.mesh.devices.flat
        init = compile_program(run.setup.lower_init(), devices, compile_cache, "init")
        state = run.setup.init_state(run.cfg.seed, init.executable)
        log.event("initialised", seconds=round(time.perf_counter() - t_init, 3),
                  compile_cache_hit=init.hit, compile_cache=init.why)  # fmt: skip
    run.state, run.restored_from = state, restored_from
    run.step = int(jax.device_get(state["step"]))


def restore_local(run: Run, t_restore: float) -> bool:
    """2a. The newest step every process holds on its own disk, if not older than the bucket's
    newest committed one: read from there, no bucket read at all (tpupod_job.local_tier)."""
    if run.local is None:
        return False
    persistent = run.checkpoints.manager.latest_step()
    step = run.local.agreed_step(persistent)
    restored = None if step is None else run.local.restore(step, run.setup.abstract_state)
    if restored is None:
        return False
    run.state, data = restored
    run.data_iter = set_state(run.data_iter, data)
    run.checkpoints.committed = persistent
    run.restored_from, run.restored_tier = step, "local"
    run.step = int(jax.device_get(run.state["step"]))
    run.log.event("restored", step=step, directory=str(run.local.root), tier="local",
                  seconds=round(time.perf_counter() - t_restore, 3), persistent=persistent)  # fmt: skip
    return True


def training_steps(run: Run) -> Iterator[StepInfo]:
    """4. One step after another up to `cfg.steps`: the batch, the dispatched step. The caller
    may stop early (a preemption); `run.state` and `run.step` are always the last step's."""
    cfg = run.cfg
    while run.step < cfg.steps:
        batch = data.global_batch(next(run.data_iter), cfg, run.setup.batch_sharding)
        run.state, metrics = run.train_step(run.state, batch)
        run.step += 1
        yield StepInfo(run.step, metrics)
