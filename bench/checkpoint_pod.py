"""Checkpoint overhead on the local pod: the job's own trainer on both workers (2 processes, gloo),
saving to the pod's GCS emulator, as uninterrupted runs observed like the watch observes a job
(bench.podrun.run_reference). A 1-step job goes first under the real watch: it brings the slice
to READY, bootstraps the workers and fills their compile caches, so every timed run starts alike.
"""

from __future__ import annotations

from pathlib import Path

from bench.podrun import run_on_pod, run_reference

TRIAL_TIMEOUT_S = 3600.0


def loop_figures(log: Path) -> tuple[float, list[float]]:
    """From worker 0's log: the one-off matmul peak probe inside the loop (0 if none: the figure
    is cached after the first run) and every step's seconds (the pod is gone after the bench)."""
    from bench.storage_trainer import events_in, step_times

    text = log.read_text(errors="replace") if log.exists() else ""
    probe = float(events_in(text).get("peak_measured", {}).get("seconds", 0.0))
    return probe, step_times(text)


def trials_on_pod(
    config: str, steps: int, every: int, order, sets_of, out: Path, console=None
) -> list:
    """Runs `order` ((round, variant) pairs; `sets_of(variant, every)`: its --set values) on one pod; per run its loop seconds (less the peak
    probe), its median step seconds (every step logged) and, unmeasured here, CPU seconds (None).
    A run that fails ends the benchmark."""
    from rich.console import Console

    from bench.storage_trainer import median_step

    console = console or Console()

    def trials(pod) -> dict:
        done = []
        for r, name in order:
            sets = " ".join(f"--set {s}" for s in [*sets_of(name, every), "log_every=1"])
            run = f"overhead-{name}-{r + 1}"
            summary, _ = run_reference(pod, f"--config {config}", TRIAL_TIMEOUT_S, console, run,
                                       f"--steps {steps} {sets}")  # fmt: skip
            if summary is None or summary.get("final_step") != steps:
                raise RuntimeError(f"{run} did not finish (see {pod.paths.tpupod_root(0)})")
            probe, times = loop_figures(pod.paths.tpupod_root(0) / f"{run}.log")
            step_s = median_step(times)
            done.append({"loop_s": summary["train_loop_s"] - probe, "step_s": step_s,
                         "step_times": times, "cpu_s": None})  # fmt: skip
            console.print(f"{run}: loop {done[-1]['loop_s']:.1f} s, median step {step_s} s")
        return {"trials": done}

    record = run_on_pod(out / "pod-overhead", f"--config {config} --steps 1", {"kinds": []},
                        references=(), after=trials, console=console)  # fmt: skip
    if record.exit != "done" or "trials" not in record.checks:
        raise RuntimeError(f"the pod's warm-up job ended {record.exit!r}")
    return record.checks["trials"]
