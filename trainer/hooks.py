"""What happens around each step, kept out of the loop (nanodo's style): the report (metrics read
one step late, so the host never stalls the device; the peak probed after the first step) and
the save (on the checkpoint policy, and at the step every process agrees on after a preemption
notice, asked of tpupod_job as any job asks it)."""

from __future__ import annotations

import sys
import time

import jax
import tpupod_job

from contract.status import JobState
from trainer.data_checkpoint import frozen
from trainer.model import flops_per_token
from trainer.peak import peak_flops
from trainer.sharding import compute_dtype
from trainer.steps import Run, StepInfo


class Reporter:
    """Step s's metrics are read after step s+1 is dispatched; every `log_every` steps (and the
    last) they go to the log and the status file with the step time, throughput and MFU."""

    def __init__(self, run: Run):
        self.run = run
        cfg = run.cfg
        self.dtype = compute_dtype(cfg)
        # The datasheet or a cached probe; a probe still to run waits for the first step.
        self.peak, self.peak_source = peak_flops(self.dtype, measure=False)
        self.flops_step = flops_per_token(cfg, run.n_params) * cfg.batch_size * cfg.seq_len
        self.pending: StepInfo | None = None  # dispatched, its metrics not yet read
        self.last_report = (run.step, time.perf_counter())
        self.last_metrics: dict = {}

    def after_step(self, info: StepInfo) -> None:
        if self.pending is not None:
            self.report(self.pending)
        self.pending = info
        if self.peak is None:
            # Probe after the first step, not before it: a (re)start is judged by its time to
            # the first step. Its metrics are read first, so the device is idle while the probe
            # runs, and the probe's time stays out of the next step_time.
            self.flush()
            t_probe = time.perf_counter()
            self.peak, self.peak_source = peak_flops(self.dtype, shared=self.run.compile_cache)
            probe_s = round(time.perf_counter() - t_probe, 3)
            self.run.log.event("peak_measured", peak_flops=self.peak, source=self.peak_source,
                               seconds=probe_s)  # fmt: skip
            self.last_report = (info.step, time.perf_counter())

    def flush(self) -> None:
        """The last dispatched step's metrics, read now (the loop is over, or a probe is due)."""
        if self.pending is not None:
            self.report(self.pending)
            self.pending = None

    def report(self, info: StepInfo) -> None:
        run, cfg, done_step = self.run, self.run.cfg, info.step
        values = {k: float(v) for k, v in jax.device_get(info.metrics).items()}
        self.last_metrics = values
        if done_step % cfg.log_every and done_step != cfg.steps:
            return
        now = time.perf_counter()
        step_time = (now - self.last_report[1]) / max(done_step - self.last_report[0], 1)
        self.last_report = (done_step, now)
        tokens_per_s = cfg.batch_size * cfg.seq_len / step_time
        values.update(step_time=step_time, tokens_per_s=tokens_per_s,
                      model_flops_per_s=self.flops_step / step_time)  # fmt: skip
        if self.peak is not None:
            values.update(mfu=self.flops_step / step_time / self.peak, peak_flops=self.peak,
                          peak_source=self.peak_source)  # fmt: skip
        run.log.scalars(done_step, values)
        run.hb.update(step=done_step, loss=values["loss"], tokens_per_s=tokens_per_s,
                      last_checkpoint=run.checkpoints.poll(),
                      local_checkpoint=run.local.saved if run.local else None,
                      local_save_s=round(run.local.blocked_s, 4) if run.local else None)  # fmt: skip


class Saver:
    """Saves at a step boundary, on every process: on the policy (the last step is saved after
    the loop whatever the policy, so the loop's time is the same work with checkpoints and
    without), and at the preemption step, which ends the loop."""

    def __init__(self, run: Run):
        self.run = run
        self.preempted = False
        self.started = 0.0  # when the last save began (a preemption's: its save_s)
        self._said_behind = False

    def after_step(self, step: int) -> bool:
        """True when the loop must end: the preemption save is under way."""
        run, cfg, checkpoints = self.run, self.run.cfg, self.run.checkpoints
        self.preempted = tpupod_job.should_stop(step)  # the step every process agrees on
        if not self.preempted and run.local is not None and run.local.due(step):
            run.local.save(
                step, run.state, frozen(run.data_iter).get_state()
            )  # the shards' copy to host, no more
        if not (self.preempted or (step < cfg.steps and checkpoints.should_save(step))):
            return False
        run.hb.update(state=JobState.SAVING, step=step)
        self.started = time.perf_counter()
        checkpoints.save(step, run.state, run.data_iter, periodic=not self.preempted)
        if self.preempted:  # stays SAVING until the commit: ops sees why it is not stepping
            run.log.event("preemption_save_started", step=step)
            return True
        if checkpoints.behind is not None and not self._said_behind:
            self._said_behind = True
            if jax.process_index() == 0:
                print(f"warning: {behind_line(checkpoints, cfg)}", file=sys.stderr)
            run.log.event("checkpoint_behind", **checkpoints.behind)
        run.hb.update(state=JobState.TRAINING, last_checkpoint=checkpoints.committed)
        return False


def behind_line(checkpoints, cfg) -> str:
    """The one warning for saves that cannot keep up with the interval, with the fix."""
    b, every = checkpoints.behind, cfg.checkpoint_every
    fix = f"--set checkpoint_every={max(2 * every, 1)}" if every else "a longer interval"
    if b.get("deferred"):
        return (
            f"checkpoint save of step {b['in_flight']} was still in flight when step "
            f"{b['step']} was due: that save is deferred to the first step after the write "
            f"finishes (training does not wait), so a kill can lose more than one interval "
            f"of steps; raise checkpoint_every ({fix})"
        )
    return (
        f"checkpoint save of step {b['in_flight']} was still in flight when step {b['step']} "
        f"was due (training waited {b['waited_s']} s): saves take longer than the interval, "
        f"so a kill can lose up to two intervals of steps; raise checkpoint_every ({fix})"
    )
