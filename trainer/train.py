"""The training run, top to bottom: prepare (set up, restore or initialise, compile:
trainer.steps), the loop over the steps with its report and save hooks (trainer.hooks), then
the end: a preemption's committed save, or the final save and summary.

Exit codes (contract.exit_codes): 0 done, 2 bad input, 75 preempted with its checkpoint
committed.
"""

from __future__ import annotations

import json
import time

import jax

from contract.exit_codes import EXIT_DONE, EXIT_PREEMPTED
from contract.status import JobState
from trainer import storage
from trainer.config import Config
from trainer.hooks import Reporter, Saver
from trainer.sharding import params_fingerprint
from trainer.status import Heartbeat
from trainer.steps import Run, prepare, training_steps


def run(
    cfg: Config,
    workdir: str,
    hb: Heartbeat,
    explicit_vocab: bool = False,
    compile_cache: str | None = None,
    local_dir: str | None = None,
) -> int:
    t_start = time.time()
    prepared = prepare(cfg, workdir, hb, explicit_vocab, compile_cache, local_dir)
    reporter, saver = Reporter(prepared), Saver(prepared)
    hb.update(state=JobState.TRAINING, compile_cache_hit=prepared.cache_hit)
    reporter.last_report = (prepared.step, time.perf_counter())
    t_loop = time.perf_counter()
    with prepared.mesh:
        for info in training_steps(prepared):
            reporter.after_step(info)
            if saver.after_step(info.step):
                break
        reporter.flush()
    loop_s = time.perf_counter() - t_loop
    if saver.preempted:
        return finish_preempted(prepared, saver, loop_s)
    return finish_done(prepared, workdir, reporter, loop_s, t_start)


def finish_preempted(run: Run, saver: Saver, loop_s: float) -> int:
    """5. Preempted: wait for the commit, then exit 75 so the supervisor restarts us."""
    committed = run.checkpoints.wait()
    save_s = round(time.perf_counter() - saver.started, 3)
    run.log.event("preempted", step=run.step, committed=committed, save_s=save_s,
                  loop_s=round(loop_s, 3))  # fmt: skip
    run.hb.update(
        state=JobState.PREEMPTED,
        step=run.step,
        last_checkpoint=committed,
        exit_code=EXIT_PREEMPTED,
        message=f"preempted at step {run.step}, checkpoint committed",
    )
    run.checkpoints.close()  # after the report: the commit is what the notice is for
    run.log.close()
    return EXIT_PREEMPTED


def finish_done(run: Run, workdir: str, reporter: Reporter, loop_s: float, t_start: float) -> int:
    """6. Done: make sure the final step is committed, then write summary.json."""
    checkpoints, step, cfg = run.checkpoints, run.step, run.cfg
    if checkpoints.committed != step and checkpoints.manager.latest_step() != step:
        run.hb.update(state=JobState.SAVING, step=step)
        checkpoints.save(step, run.state, run.data_iter)
    committed = checkpoints.wait()
    checkpoints.close()
    fingerprint, params_norm = params_fingerprint(run.state["params"])
    summary = {
        "final_step": step,
        "final_loss": reporter.last_metrics.get("loss"),
        "tokens_seen": step * cfg.batch_size * cfg.seq_len,
        "wall_time_s": round(time.time() - t_start, 3),
        "train_loop_s": round(loop_s, 3),
        "params_fingerprint": fingerprint,
        "params_norm": params_norm,
        "params": run.n_params,
        "restored_from": run.restored_from,
        "restored_tier": run.restored_tier,
        "local_saves_skipped": run.local.skipped if run.local else None,
        "compile_cache_hit": run.cache_hit,
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "saves_deferred": checkpoints.deferred,  # periodic saves coalesced into a later one
        # the longest loop save that began while the previous one still wrote (its start included)
        "save_waited_behind_s": round(checkpoints.waited_behind_s, 3),
    }
    if jax.process_index() == 0:
        storage.write_bytes(storage.join(workdir, "summary.json"), json.dumps(summary).encode())
    run.log.event("done", **summary)
    run.log.close()
    run.hb.update(
        state=JobState.DONE,
        step=step,
        last_checkpoint=committed,
        exit_code=EXIT_DONE,
        loss=reporter.last_metrics.get("loss"),
    )
    return EXIT_DONE
