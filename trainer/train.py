"""The training run, top to bottom: setup, restore-or-init, compile, loop, save, summary.

Exit codes (trainer.status): 0 done, 2 bad input, 75 preempted with its checkpoint committed.
"""

from __future__ import annotations

import json
import sys
import time

import jax

from contract.exit_codes import EXIT_DONE, EXIT_PREEMPTED
from contract.status import JobState
from trainer import data, storage
from trainer.checkpoint import Checkpoints, Preemption
from trainer.compile_cache import compile_program
from trainer.config import Config
from trainer.metrics import Heartbeat, MetricsLog
from trainer.model import count_params, flops_per_token
from trainer.peak import peak_flops
from trainer.restore import restore_newest_readable
from trainer.sharding import Setup, compute_dtype, make_mesh, params_fingerprint


def run(
    cfg: Config,
    workdir: str,
    hb: Heartbeat,
    preemption: Preemption,
    explicit_vocab: bool = False,
    compile_cache: str | None = None,
) -> int:
    t_start = time.time()
    pid = jax.process_index()
    log = MetricsLog(workdir, enabled=pid == 0)

    # 1. The data (its tokenizer fixes the vocabulary), mesh, model, optimizer, shardings.
    loaded = data.load_source(cfg)
    cfg, vocab_note = data.fit_vocab(cfg, loaded, explicit_vocab)
    if vocab_note and pid == 0:
        print(f"note: {vocab_note}", file=sys.stderr, flush=True)
    tokens, source = loaded.tokens, loaded.uri
    mesh = make_mesh(cfg)
    setup = Setup(cfg, mesh)
    data_iter = data.make_iterator(cfg, tokens)
    n_params = count_params(setup.abstract_state["params"])
    log.event(
        "setup",
        params=n_params,
        devices=jax.device_count(),
        processes=jax.process_count(),
        mesh=dict(mesh.shape),
        data=source,
        data_tokens=int(len(tokens)),
        tokenizer=loaded.tokenizer.to_json(),
        vocab_note=vocab_note,
        config=cfg.__dict__,
    )

    # 2. Resume from the latest committed checkpoint, or create a fresh state already sharded.
    # A committed step that cannot be read is reported, moved aside, and the one before it used.
    t_restore = time.perf_counter()
    hb.update(state=JobState.RESTORING)
    checkpoints = Checkpoints(workdir, cfg, jax.process_count(), data.checkpoint_meta(cfg, loaded))
    restored_from, state, data_iter, unreadable = restore_newest_readable(
        checkpoints, setup.abstract_state, data_iter
    )
    for bad in unreadable:
        line = bad.line(restored_from)
        if pid == 0:
            print(f"warning: {line}", file=sys.stderr, flush=True)
        log.event("checkpoint_fallback", step=bad.step, restored=restored_from, file=bad.file,
                  reason=bad.reason, moved_to=bad.moved_to)  # fmt: skip
        record = {"step": bad.step, "restored": restored_from, "moved_to": bad.moved_to,
                  "line": line}  # fmt: skip
        hb.update(message=f"checkpoint_fallback: {line}", fallbacks=[*hb.status.fallbacks, record])
    checkpoints.committed = restored_from
    if restored_from is not None:
        restore_s = round(time.perf_counter() - t_restore, 3)  # listing, checks, every read
        log.event("restored", step=restored_from, directory=checkpoints.directory,
                  seconds=restore_s, verify_s=round(checkpoints.verify_s, 3))  # fmt: skip
    else:  # a fresh state; its init program, like the step's, comes from the cache when it can
        t_init = time.perf_counter()
        init = compile_program(setup.lower_init(), mesh.devices.flat, compile_cache, "init")
        state = setup.init_state(cfg.seed, init.executable)
        log.event("initialised", seconds=round(time.perf_counter() - t_init, 3),
                  compile_cache_hit=init.hit, compile_cache=init.why)  # fmt: skip
    step = int(jax.device_get(state["step"]))
    hb.update(
        state=JobState.COMPILING,
        step=step,
        restored_from=restored_from,
        last_checkpoint=checkpoints.committed,
    )

    # 3. Compile the train step, or load it when every process kept it from a previous start.
    t0 = time.perf_counter()
    compiled = compile_program(setup.lower_train_step(), mesh.devices.flat, compile_cache)
    train_step, cache_hit = compiled.executable, compiled.hit
    log.event("compiled", seconds=round(time.perf_counter() - t0, 3), compile_cache_hit=cache_hit,
              compile_cache=compiled.why, cache_load_s=round(compiled.load_s, 3))  # fmt: skip
    # The datasheet or a cached probe; a probe still to run waits for the first step (below).
    dtype = compute_dtype(cfg)
    peak, peak_source = peak_flops(dtype, measure=False)
    flops_step = flops_per_token(cfg, n_params) * cfg.batch_size * cfg.seq_len
    hb.update(state=JobState.TRAINING, compile_cache_hit=cache_hit)

    # 4. The loop. Metrics of step s are read after step s+1 is dispatched: the host never stalls
    # the device. Saves and the preemption check happen at every step boundary, on every process.
    pending = None  # (step, device metrics) not yet read
    last_report = (step, time.perf_counter())
    last_metrics: dict = {}
    preempted = False
    said_behind = False

    def report(done_step: int, metrics) -> None:
        nonlocal last_report, last_metrics
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        last_metrics = values
        if done_step % cfg.log_every and done_step != cfg.steps:
            return
        now = time.perf_counter()
        step_time = (now - last_report[1]) / max(done_step - last_report[0], 1)
        last_report = (done_step, now)
        tokens_per_s = cfg.batch_size * cfg.seq_len / step_time
        values.update(
            step_time=step_time,
            tokens_per_s=tokens_per_s,
            model_flops_per_s=flops_step / step_time,
        )
        if peak is not None:
            values.update(
                mfu=flops_step / step_time / peak, peak_flops=peak, peak_source=peak_source
            )
        log.scalars(done_step, values)
        hb.update(
            step=done_step,
            loss=values["loss"],
            tokens_per_s=tokens_per_s,
            last_checkpoint=checkpoints.poll(),
        )

    t_loop = time.perf_counter()
    with mesh:
        while step < cfg.steps:
            batch = data.global_batch(next(data_iter), cfg, setup.batch_sharding)
            state, metrics = train_step(state, batch)
            step += 1
            if pending is not None:
                report(*pending)
            pending = (step, metrics)
            if peak is None:
                # Probe after the first step, not before it: a (re)start is judged by its time to
                # the first step. Its metrics are read first, so the device is idle while the probe
                # runs, and the probe's time stays out of the next step_time.
                report(*pending)
                pending, t_probe = None, time.perf_counter()
                peak, peak_source = peak_flops(dtype)
                probe_s = round(time.perf_counter() - t_probe, 3)
                log.event("peak_measured", peak_flops=peak, source=peak_source, seconds=probe_s)
                last_report = (step, time.perf_counter())
            preempted = preemption.reached(step, checkpoints)
            # The last step is saved after the loop whatever the policy (step 6), so the loop's
            # time is the same work with checkpoints and without: a policy costs only its saves.
            if preempted or (step < cfg.steps and checkpoints.should_save(step)):
                hb.update(state=JobState.SAVING, step=step)
                t_save = time.perf_counter()
                checkpoints.save(step, state, data_iter, periodic=not preempted)
                if preempted:  # stays SAVING until the commit: ops sees why it is not stepping
                    log.event("preemption_save_started", step=step)
                    break
                if checkpoints.behind is not None and not said_behind:
                    said_behind = True
                    if pid == 0:
                        print(f"warning: {checkpoints.behind_line(cfg)}", file=sys.stderr)
                    log.event("checkpoint_behind", **checkpoints.behind)
                hb.update(state=JobState.TRAINING, last_checkpoint=checkpoints.committed)
        if pending is not None:
            report(*pending)
    loop_s = time.perf_counter() - t_loop

    # 5. Preempted: wait for the commit, then exit 75 so the supervisor restarts us.
    if preempted:
        committed = checkpoints.wait()
        save_s = round(time.perf_counter() - t_save, 3)
        log.event(
            "preempted", step=step, committed=committed, save_s=save_s, loop_s=round(loop_s, 3)
        )
        hb.update(
            state=JobState.PREEMPTED,
            step=step,
            last_checkpoint=committed,
            exit_code=EXIT_PREEMPTED,
            message=f"preempted at step {step}, checkpoint committed",
        )
        checkpoints.close()  # after the report: the commit is what the notice is for
        log.close()
        return EXIT_PREEMPTED

    # 6. Done: make sure the final step is committed, then write summary.json.
    if checkpoints.committed != step and checkpoints.manager.latest_step() != step:
        hb.update(state=JobState.SAVING, step=step)
        checkpoints.save(step, state, data_iter)
    committed = checkpoints.wait()
    checkpoints.close()
    fingerprint, params_norm = params_fingerprint(state["params"])
    summary = {
        "final_step": step,
        "final_loss": last_metrics.get("loss"),
        "tokens_seen": step * cfg.batch_size * cfg.seq_len,
        "wall_time_s": round(time.time() - t_start, 3),
        "train_loop_s": round(loop_s, 3),
        "params_fingerprint": fingerprint,
        "params_norm": params_norm,
        "params": n_params,
        "restored_from": restored_from,
        "compile_cache_hit": cache_hit,
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "saves_deferred": checkpoints.deferred,  # periodic saves coalesced into a later one
        # the longest loop save that began while the previous one still wrote (its start included)
        "save_waited_behind_s": round(checkpoints.waited_behind_s, 3),
    }
    if pid == 0:
        storage.write_bytes(storage.join(workdir, "summary.json"), json.dumps(summary).encode())
    log.event("done", **summary)
    log.close()
    hb.update(
        state=JobState.DONE,
        step=step,
        last_checkpoint=committed,
        exit_code=EXIT_DONE,
        loss=last_metrics.get("loss"),
    )
    return EXIT_DONE
