"""Spot capacity on the local pod: recovery through a queued resource against nodes.create, and
what a preemption without notice costs under the job's time bound (max_loss_minutes).

Three pod runs of `rounds` no-notice kills each (a kill is GCP's honest case: no notice):
  queued   the slice comes back through a queued resource (tpupod:createVia queued, the default)
  direct   through nodes.create (createVia direct)
  bounded  queued, the trainer's step-based saves off (checkpoint_every=0) and the job's
           max_loss_minutes 0.05 (3 s): only the time bound saves, so the work a kill loses is
           what that bound leaves, whatever the step time
Work lost per kill: the seconds from when worker 0's old trainer first reported the step the new
one restored from to the kill (status samples, 0.2 s apart), and the steps between.

    uv run python -m bench capacity
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.podrun import RunRecord, run_on_pod
from bench.recovery_bench import incidents
from bench.report import Figure, median, spread
from contract.job import JOB_FILE, Job, parse
from infra.builtin_job import builtin

MAX_LOSS_MINUTES = 0.05  # 3 s: short against the run, long against a tiny step
SAVE_IN_FLIGHT_S = 2.0  # a time-bound save may start just after the bound, and takes this long
ARGS = "--config tiny --steps 1000000"
LEGS = {
    "queued": ({"create_via": "queued"}, ARGS, None),
    "direct": ({"create_via": "direct"}, ARGS, None),
    "bounded": ({"create_via": "queued"}, f"{ARGS} --set checkpoint_every=0", MAX_LOSS_MINUTES),
}


def bounded_job(trainer_args: str, minutes: float) -> Job:
    """The built-in trainer's job with `max_loss_minutes` set, as a tpupod-job.yaml would say."""
    base = builtin(trainer_args)
    data = yaml.safe_load(base.files[JOB_FILE])
    data["max_loss_minutes"] = minutes
    text = yaml.safe_dump(data, sort_keys=False)
    spec = parse(text, f"{base.source}, max_loss_minutes {minutes:g}")
    return Job(spec=spec, files={JOB_FILE: text.encode()}, source=f"{base.source}, "
               f"max_loss_minutes {minutes:g}")  # fmt: skip


def reanalyse(out_dir: Path) -> dict:
    """The legs' saved records (capacity-LEG-run.json in `out_dir`) analysed again, run nothing."""
    return {leg: report_run(RunRecord.load(out_dir / f"capacity-{leg}-run.json")) for leg in LEGS}


def run(out_dir: Path, rounds: int = 3, min_steps: int = 30, console=None) -> dict:
    result = {}
    for leg, (options, args, minutes) in LEGS.items():
        job = bounded_job(args, minutes) if minutes else None
        schedule = {"kinds": ["kill"] * rounds, "min_steps": min_steps, "stop_steps": min_steps}
        record = run_on_pod(out_dir / f"pod-capacity-{leg}", "" if job else args, schedule,
                            notice=0.0, console=console, warm=True, job=job,
                            pod_options=options)  # fmt: skip
        record.save(out_dir / f"capacity-{leg}-run.json")
        result[leg] = report_run(record)
    return result


def report_run(record: RunRecord) -> dict:
    incs = incidents(record)
    status = [s for s in record.sampled.get("status", []) if s["source"] == "job"]
    for inc, fault in zip(incs, record.injected, strict=True):
        inc["seconds_lost"] = seconds_lost(status, fault["time"], inc["restored_from"])
    return {"trainer_args": record.trainer_args, "outcome": record.exit, "incidents": incs}


def seconds_lost(status: list[dict], t0: float, restored_from: int | None) -> float | None:
    """Wall seconds of work a kill at `t0` cost: from when worker 0's trainer that the kill
    ended (the last one to report before it) first reported the restored step, to the kill."""
    before = [s for s in status if s["worker"] == 0 and s["t"] < t0]
    if restored_from is None or not before:
        return None
    killed = before[-1]["pid"]
    reached = [s["t"] for s in before if s["pid"] == killed and s["step"] >= restored_from]
    return t0 - min(reached) if reached else None


def figures(result: dict) -> list[Figure]:
    totals = {leg: [i["fault_to_first_step_s"] for i in result[leg]["incidents"]
                    if i["fault_to_first_step_s"]] for leg in ("queued", "direct")}  # fmt: skip
    recreate = {leg: [i["phases"]["re-creation"] for i in result[leg]["incidents"]
                      if "re-creation" in i["phases"]] for leg in ("queued", "direct")}  # fmt: skip
    figs = []
    for leg, how in (("queued", "a queued resource"), ("direct", "nodes.create")):
        figs.append(Figure(f"capacity: no-notice kill through {how}, fault -> first step",
                           median(totals[leg]), "s", n=len(totals[leg]),
                           spread=spread(totals[leg], "s"),
                           note=f"median; re-creation phase {median(recreate[leg]) or 0:.1f} s "
                           "(median); local pod, 2 CPU workers"))  # fmt: skip
    n = min(len(totals["queued"]), len(totals["direct"]))
    both = totals["queued"] and totals["direct"]
    difference = median(totals["queued"]) - median(totals["direct"]) if both else None
    figs.append(Figure(
        "capacity: queued resource minus nodes.create, fault -> first step",
        round(difference, 2) if difference is not None else "not measured: a leg saw no step",
        "s" if difference is not None else "", "<= 2 s", None if difference is None else
        difference <= 2.0, n=n, note="difference of the two medians above (no-notice kills)",
    ))  # fmt: skip
    incs = result["bounded"]["incidents"]
    lost = [i["seconds_lost"] for i in incs if i["seconds_lost"] is not None]
    steps = [i["steps_lost"] for i in incs if i["steps_lost"] is not None]
    bound = MAX_LOSS_MINUTES * 60 + SAVE_IN_FLIGHT_S
    figs.append(Figure(
        "capacity: no-notice kill, time-bound saves only: seconds of work lost",
        round(max(lost), 2) if lost else "not measured: no restore seen", "s" if lost else "",
        f"<= {bound:g} s, every event", (max(lost) <= bound) if lost else None, n=len(lost),
        spread=", ".join(f"{x:.1f}" for x in lost) + (f" s; steps lost {', '.join(map(str, steps))}"
                                                      if steps else ""),
        note=f"the largest event; max_loss_minutes {MAX_LOSS_MINUTES:g} "
        f"({MAX_LOSS_MINUTES * 60:g} s) + {SAVE_IN_FLIGHT_S:g} s for a save in flight; "
        "checkpoint_every=0",
    ))  # fmt: skip
    return figs
