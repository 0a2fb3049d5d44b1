"""A user's program under tpupod (issue 20's benchmarks), on the 2-worker local pod:

- overhead: the job (default examples/jobs/flax-plain) run under tpupod (the worker's launcher,
  bootstrap/jobrun.py: contract, secrets, output followed, progress read, logs shipped) against
  the same program run directly by the same processes with the same environment, each timed
  from the first worker's launch to the last one's exit, in interleaved rounds (each variant
  once a round, the order alternating); the goal: the ratio of the medians <= 1.03.
- recovery: crash, no-notice kill and preemption with notice, `rounds` of each, recovered by
  the real watch: fault -> the job's first new step (its first progress after the restart),
  against the built-in trainer's rows of `bench recovery` (the goal: no slower).

    uv run python -m bench job [--job DIR] [--job-rounds 5] [--rounds 3]
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.podrun import RunRecord, run_on_pod
from bench.recovery_bench import LABELS
from bench.report import Figure, median, spread

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JOB = REPO / "examples" / "jobs" / "flax-plain"
KINDS = ("crash", "kill", "notice")
OVERHEAD_GOAL = 1.03
# Both variants: a fresh run directory each, launch and exit stamped by the worker's shell.
UNDER_TPUPOD = (
    'R="$TPUPOD_ROOT"; cd -P "$R/current" && t0=$(date +%s.%N) && '
    '.venv/bin/python -I -S bootstrap/jobrun.py reference "{run}" > "$R/{run}.out" 2>&1; '
    'rc=$?; echo "times $t0 $(date +%s.%N) $rc"'
)
DIRECT = (
    'R="$TPUPOD_ROOT"; cd -P "$R/current/job" && '
    'while IFS=\'=\' read -r k v; do export "$k=$v"; done < "$R/job.env" && '
    'parent="${{TPUPOD_RUN_DIR%/*}}" && '
    'export TPUPOD_RUN_ID="{run}" TPUPOD_RUN_DIR="$parent/{run}" '
    'TPUPOD_CHECKPOINT_DIR="$parent/{run}/checkpoints" TPUPOD_ATTEMPT=1 '
    'TPUPOD_STATUS_FILE="$R/{run}-status.json" PATH="$(cat "$R/job.venv")/bin:$PATH" && '
    "run=$(python3 -I -S -c 'import json, sys; print(json.load(open(sys.argv[1]))[\"run\"])' "
    '"$R/job.json") && t0=$(date +%s.%N) && bash -c "$run" > "$R/{run}.out" 2>&1; '
    'rc=$?; echo "times $t0 $(date +%s.%N) $rc"'
)
VARIANTS = {"tpupod": UNDER_TPUPOD, "direct": DIRECT}


def timed_run(pod, variant: str, run: str, timeout: float = 1800.0) -> float:
    """One run of the job on every worker at once; first launch -> last exit, seconds."""
    from demo.reference import pod_provider
    from ops.fleet.workers import WorkerGroup, as_root

    workers = pod_provider(pod.paths.root).describe().workers
    with WorkerGroup(workers, retries=0) as group:
        outcomes = group.run(as_root(VARIANTS[variant].format(run=run)), timeout=timeout)
    times = []
    for o in outcomes.values():
        line = next((ln for ln in o.stdout.splitlines() if ln.startswith("times ")), "")
        parts = line.split()
        if len(parts) != 4 or parts[3] != "0":
            raise RuntimeError(f"{variant} run {run} failed on worker {o.index}: {o.stdout!r}")
        times.append((float(parts[1]), float(parts[2])))
    return max(end for _, end in times) - min(start for start, _ in times)


def overhead(job_dir: Path, rounds: int, out: Path, console) -> dict:
    """`rounds` rounds of both variants on one pod, after the job's own first run (warm-up)."""
    from contract.job import load

    runs: dict[str, list[float]] = {"tpupod": [], "direct": []}

    def trials(pod) -> dict:
        for r in range(rounds):
            order = ("tpupod", "direct") if r % 2 == 0 else ("direct", "tpupod")
            for variant in order:
                seconds = timed_run(pod, variant, f"overhead-{variant}-{r + 1}")
                runs[variant].append(seconds)
                console.print(f"round {r + 1}: {variant} {seconds:.2f} s")
        return {"runs": runs}

    job = load(job_dir)
    record = run_on_pod(out / "pod-job-overhead", "", {"kinds": []}, references=(),
                        after=trials, console=console, job=job)  # fmt: skip
    if record.exit != "done" or "runs" not in record.checks:
        raise RuntimeError(f"the pod's warm-up run ended {record.exit!r}")
    return {"job": str(job_dir), "runs": record.checks["runs"]}


def longer(job, steps: int):
    """The job with `--steps N` in its run (the examples take it) and `steps` raised to `steps`:
    room for every fault of the recovery schedule, which ends the run itself."""
    import re
    from dataclasses import replace

    run, found = re.subn(r"--steps[ =]\d+", f"--steps {steps}", job.spec.run)
    if not found:
        raise ValueError(f"{job.source}: its run takes no --steps; the recovery bench needs one")
    return replace(job, spec=job.spec.model_copy(update={"run": run, "steps": steps}))


def recovery(job_dir: Path, rounds: int, notice: float, out: Path, console) -> dict:
    """crash, kill and notice, `rounds` of each, on one pod under the real watch."""
    from contract.job import load

    job = longer(load(job_dir), 1_000_000)
    kinds = [k for _ in range(rounds) for k in KINDS]
    schedule = {"kinds": kinds, "min_steps": 30, "stop_steps": 30}
    record = run_on_pod(out / "pod-job-recovery", "", schedule, notice=notice, console=console,
                        job=job, hang=10.0, warm=True)  # fmt: skip
    record.save(out / "job-recovery-run.json")
    return {"job": str(job_dir), "incidents": first_steps(record)}


def first_steps(record: RunRecord) -> list[dict]:
    """Per fault: fault -> the new attempt's first progress on worker 0 (its status file, which
    the launcher clears at every start, written again: the job's first step)."""
    faults = record.injected
    ends = [f["time"] for f in faults[1:]] + [float("inf")]
    status = [s for s in record.sampled.get("status", []) if s["source"] == "job"]
    found = []
    for fault, end in zip(faults, ends, strict=True):
        window = [e for e in record.events if fault["time"] <= e["time"] < end]
        start = next((e["time"] - e.get("seconds", 0.0) for e in window
                      if e["event"] in ("restarted", "ready")), None)  # fmt: skip
        step = next((s for s in status if s["worker"] == 0 and start is not None
                     and (s.get("updated") or s["t"]) > start and s["t"] < end), None)  # fmt: skip
        at = (step.get("updated") or step["t"]) if step else None
        found.append({"kind": fault["kind"], "fault": fault["time"], "first_step": at,
                      "seconds": None if at is None else at - fault["time"]})  # fmt: skip
    return found


def builtin_rows(benchmarks_json: Path) -> dict[str, float]:
    """The built-in trainer's `bench recovery` medians (fault -> first step), by kind."""
    try:
        rows = json.loads(benchmarks_json.read_text())
    except (OSError, ValueError):
        return {}
    rows = rows.get("figures", rows) if isinstance(rows, dict) else rows
    found = {}
    for kind in KINDS:
        name = f"recovery, {LABELS[kind]}: fault -> first step (recovery run)"
        row = next(
            (r for r in rows if r.get("name") == name and r.get("bench") == "recovery"), None
        )
        if row and isinstance(row.get("value"), int | float):
            found[kind] = float(row["value"])
    return found


def figures(result: dict, builtin: dict[str, float]) -> list[Figure]:
    figs = []
    job = Path(result.get("job", "")).name or "job"
    if "runs" in result:
        tp, direct = result["runs"]["tpupod"], result["runs"]["direct"]
        ratio = median(tp) / median(direct) if tp and direct else None
        rounds = [a / b for a, b in zip(tp, direct, strict=False)]
        figs.append(Figure(
            f"job overhead: {job} under tpupod / run directly (local pod, 2 workers)",
            ratio if ratio is not None else "not measured", "x" if ratio else "",
            f"<= {OVERHEAD_GOAL:g} (ratio of medians, >= 3 rounds)",
            None if ratio is None or len(tp) < 3 else ratio <= OVERHEAD_GOAL,
            n=min(len(tp), len(direct)), spread=spread(rounds, "x", digits=3),
            note=f"first launch -> last exit; medians {median(tp):.2f} s under tpupod, "
            f"{median(direct):.2f} s direct; interleaved rounds, order alternating; spread: "
            "each round's ratio",
        ))  # fmt: skip
    for kind in KINDS:
        secs = [i["seconds"] for i in result.get("incidents", []) if i["kind"] == kind]
        secs = [s for s in secs if s is not None]
        if not result.get("incidents"):
            break
        value, ref = median(secs), builtin.get(kind)
        goal = f"<= the built-in trainer's {ref:.2f} s" if ref is not None else ""
        met = None if value is None or ref is None or len(secs) < 3 else value <= ref
        figs.append(Figure(
            f"job recovery, {LABELS[kind]}: fault -> first new step ({job})",
            value if value is not None else "not measured: no first step seen",
            "s" if value is not None else "", goal, met, n=len(secs), spread=spread(secs, "s"),
            note="median; the job's first progress after its restart (status file); the "
            "built-in's row is `bench recovery`'s, from BENCHMARKS.json"
            + ("" if ref is not None else "; no built-in row to judge against"),
        ))  # fmt: skip
    return figs


def run(job_dir: Path, rounds: int, recovery_rounds: int, notice: float, out: Path,
        console) -> dict:  # fmt: skip
    started = time.time()
    result = overhead(job_dir, rounds, out, console)
    result.update(recovery(job_dir, recovery_rounds, notice, out, console))
    result["seconds"] = time.time() - started
    return result
