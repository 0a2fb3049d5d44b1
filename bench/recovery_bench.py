"""Recovery on the local pod, in phases: preemptions with notice, without, crashes and hangs, in
turn, three of each (`rounds`), so every kind's recovery is a median of three. The first fault
waits until the job's environment is published (its bytecode in the bucket), as hours of a real
run have done by the first preemption: every fault meets the steady state.

Each phase is the gap between two consecutive milestones, so the phases add up to the total:
  injected        the pod call (bench.faults)       detected      journal `detected`
  saved           old trainer's status `preempted`  recreating    journal `recreated` - seconds
  ready           journal `ready`                   bootstrapped  last bootstrap.json phase end
then worker 0's new trainer, by its own clock (event `time`s and status.json heartbeats):
  process_start   `started`.process_start (/proc;   started       its `started` event
                  a standby's: its promotion)
  imported        `jax_initialized` - its seconds   jax_initialized  that event
  setup           its `setup` event                 restored      status `compiling`
  compiled        its `compiled` event              training      status `training`
  first_step      first status step past the restore point
`imported` also closes the workdir check; `setup` is the mesh, model and data. Milestones come from
several workers and clocks: one earlier than the milestone before it (worker 0's trainer starting
while worker 1 still bootstraps) ends a zero-length phase. A trainer without `started` lines falls
back to its first status.json (`trainer_up`) and to when the sampler saw a line (0.2 s poll).

    uv run python -m bench recovery
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from bench.podrun import RunRecord, run_on_pod
from bench.report import Figure, median, spread
from bench.steps_lost import Loss, goal_text, judge
from bench.trainer_log import restore_end, trainer_events, trainer_milestones

STEPPING = {"training", "saving", "preempted", "done"}
# milestone -> the phase that ends there
PHASES = {
    "detected": "detection",
    "forensics": "hang forensics",
    "saved": "save on notice + exit",
    "recreating": "slice going away",
    "restarting": "wait before restart (crash-loop backoff)",
    "ready": "re-creation",
    "restarted": "restart (stop, clear, start)",
    "bootstrapped": "bootstrap",
    "process_start": "trainer launch",
    "started": "interpreter start",
    "trainer_up": "trainer start + imports",  # only without a `started` line
    "imported": "imports + workdir check",
    "jax_initialized": "JAX init",
    "setup": "mesh + data setup",
    "restored": "restore",
    "compiled": "compile",
    "training": "after compile",
    "first_step": "first step",
}
# never reported missing: present only on some paths
OPTIONAL = {"restarted", "restarting", "trainer_up", "forensics"}
# A recreate's phases that are tpupod's own (issue 37): from the new VM's boot to the first step.
# The cloud's are the slice going away and its re-creation; detection and the save on notice
# are the watcher's and the job's, in neither share.
TPUPOD_SHARE = list(PHASES.values())[list(PHASES).index("bootstrapped") :]
CLOUD_SHARE = ("slice going away", "re-creation")


PHASE_NOTE = (
    "milestones from the watch journal, bootstrap.json (slowest worker), and worker 0's trainer "
    "by its own clock: event times (started, with its /proc start; jax_initialized, less its "
    "seconds; setup; compiled) and status.json heartbeats (compiling, training, first step); "
    "phases that overlap the previous one count from its end"
)


def _first(items, pred):
    return next((x for x in items if pred(x)), None)


def incidents(record: RunRecord) -> list[dict]:
    """Milestones (unix time) and phases (s) of every injected fault, in order."""
    faults = record.injected
    ends = [f["time"] for f in faults[1:]] + [float("inf")]
    return [_incident(record, f, end) for f, end in zip(faults, ends, strict=True)]


def _incident(record: RunRecord, fault: dict, t_end: float) -> dict:
    t0 = fault["time"]
    status = [s for s in record.sampled.get("status", []) if s["source"] == "job"]
    lines = record.sampled.get("lines", [])
    window = [e for e in record.events if t0 <= e["time"] < t_end]
    ev = {e["event"]: e for e in reversed(window)}  # the first of each name
    m: dict[str, float] = {"injected": t0}
    if "detected" in ev:
        m["detected"] = ev["detected"]["time"]
    if "recreated" in ev:
        m["recreating"] = ev["recreated"]["time"] - ev["recreated"].get("seconds", 0.0)
    for name in ("forensics", "ready", "restarted"):
        if name in ev:
            m[name] = ev[name]["time"]
    if "restarted" in ev:
        m["restarting"] = ev["restarted"]["time"] - ev["restarted"].get("seconds", 0.0)
    boots = [b for b in record.sampled.get("boots", []) if t0 <= b["started"] < t_end]
    ends = [b["phases"][-1].get("ended") or b["updated"] for b in boots if b.get("phases")]
    if "ready" in m and ends and len(ends) == record.workers:
        m["bootstrapped"] = max(ends)
    # worker 0's trainer before the fault, and the next one
    old = [s for s in status if s["worker"] == 0 and s["t"] < t0]
    old_pid = old[-1]["pid"] if old else None
    saved = _first(
        status, lambda s: s["pid"] == old_pid and t0 < s["t"] < t_end and s["state"] == "preempted"
    )
    if saved and fault["kind"] == "notice":  # a failure restart's SIGTERM is no save on notice
        m["saved"] = saved["heartbeat"]
    old = [s for s in status if s["worker"] == 0 and s["pid"] == old_pid]
    new = [s for s in status if s["worker"] == 0 and s["pid"] != old_pid and t0 < s["t"] < t_end]
    # the first new trainer that got through its restore (a restore-kill's first one did not)
    through = [s["pid"] for s in new if s["state"] == "compiling"]
    new = [s for s in new if s["pid"] == (through or [s["pid"] for s in new])[0]]
    log = trainer_events(lines, t0, t_end, new[0]["pid"], new[0]["heartbeat"]) if new else {}
    m.update(trainer_milestones(log))
    if new and "started" not in m:
        m["trainer_up"] = new[0]["heartbeat"]
    compiling = restore_end(new, log)
    compiled = log.get("compiled")
    restored_from = compiling["restored_from"] if compiling else None
    if compiling:
        m["restored"] = compiling["heartbeat"]
        if compiled:
            c = compiled["json"]
            m["compiled"] = c["time"] if "time" in c else m["restored"] + c["seconds"]
        stepped = [s for s in new if s["step"] > (restored_from or 0) and s["state"] in STEPPING]
        if stepped:
            m["first_step"] = stepped[0]["heartbeat"]
    training = _first(new, lambda s: s["state"] == "training")
    if training:
        m["training"] = training["heartbeat"]
    # the last step the old trainer reached (it may step on after SIGTERM until it saves)
    last_step = max((s["step"] for s in old), default=fault.get("step"))
    resumed = ev.get("resumed", {})
    return {
        "kind": fault["kind"],
        "notice": fault.get("notice"),
        "step_at_fault": last_step,
        "restored_from": restored_from,
        "committed_before": committed_before(status, t0),
        "steps_lost": None if restored_from is None else max(0, last_step - restored_from),
        "watch_steps_lost": resumed.get("steps_lost"),
        "tier": compiling.get("restored_tier") if compiling else None,  # local or persistent
        "detected_to_resumed_s": resumed.get("recovery_s"),
        "compile_cache_hit": compiled["json"].get("compile_cache_hit") if compiled else None,
        "milestones": m,
        "phases": phases(m),
        # every kind from the fault, a hang's heartbeat limit included (bench/rules.py)
        "fault_to_first_step_s": m["first_step"] - t0 if "first_step" in m else None,
    }


def committed_before(status: list[dict], t0: float) -> int | None:
    """The newest step the trainers running at `t0` reported committed: each worker's latest
    process before the fault, not every process before it. A step an earlier process committed
    and a later restore set aside (damaged-newest damages it on purpose) is not theirs to keep;
    a step the current processes committed and the next restore skips still counts."""
    before = [s for s in status if s["t"] < t0]
    latest = {s["worker"]: s["pid"] for s in sorted(before, key=lambda s: s["t"])}
    steps = [s["last_checkpoint"] for s in before if latest[s["worker"]] == s["pid"]
             and s.get("last_checkpoint") is not None]  # fmt: skip
    return max(steps, default=None)


def phases(m: dict[str, float]) -> dict[str, float]:
    """Consecutive milestone gaps, in PHASES order, over the milestones present. A milestone
    earlier than the one before it (another worker's, or another clock's) ends a zero-length
    phase, so the phases stay >= 0 and still add up to injected -> the last milestone."""
    out, last = {}, m["injected"]
    for key, name in PHASES.items():
        if key in m:
            t = max(m[key], last)
            out[name] = round(t - last, 3)
            last = t
    return out


def run(
    out_dir: Path,
    preset: str = "tiny",
    min_steps: int = 30,
    notice: float = 30.0,
    sets: tuple[str, ...] = (),
    console=None,
    rounds: int = 3,
    api: str = "tpu",
) -> dict:
    """`api`: the slice as a Cloud TPU API node, or (`compute`) a Compute Engine managed
    instance group (issue 51); its rows say so."""
    args = " ".join([f"--config {preset} --steps 1000000", *(f"--set {s}" for s in sets)])
    kinds = [k for _ in range(rounds) for k in RECOVERY_KINDS]
    schedule = {"kinds": kinds, "min_steps": min_steps, "stop_steps": min_steps}
    record = run_on_pod(out_dir / "pod-recovery", args, schedule, notice=notice, console=console,
                        hang=HANG_S, warm=True, pod_options={"api": api})  # fmt: skip
    record.save(out_dir / f"recovery-run{'-compute' if api == 'compute' else ''}.json")
    return {**report_run(record), "api": api}


def report_run(record: RunRecord) -> dict:
    """A run's result, from the run or from its saved record (`--record`)."""
    return {
        "trainer_args": record.trainer_args,
        "outcome": record.exit,
        "incidents": incidents(record),
    }


# The recovery goal's kinds, each `rounds` times (a median of >= 3 per kind).
RECOVERY_KINDS = ("notice", "kill", "crash", "hang")
HANG_S = 10.0  # watch's heartbeat limit here: a hang is detected this long after it begins
LABELS = {
    "notice": "preemption with notice",
    "kill": "no-notice kill",
    "crash": "crash",
    "hang": "hang",
    "save-kill": "kill during a save",
    "stockout": "kill, stockout on recreate",
    "watch-kill": "kill, watch killed mid-recovery",
    "damaged-newest": "kill, newest checkpoint damaged",
    "restore-kill": "crash, then a kill during the restore",
    "save-crash": "crash during a save",
    "watch-crash": "crash, watch killed mid-restart",
    "damaged-crash": "crash, newest checkpoint damaged",
}
RECOVERY_GOAL_S = 15.0
TIER_GOALS_S = {"crash": 5.0, "hang": 5.0, "notice": 8.0, "kill": 8.0}  # issue 50


MIN_EVENTS = 3  # the recovery goal is a median of at least this many events per kind


def checkpoint_interval(trainer_args: str) -> int | None:
    """The job's `checkpoint_every`: its --set override, else its preset's (None: unknown)."""
    return _config_value(trainer_args, "checkpoint_every")


def local_interval(trainer_args: str) -> int | None:
    """The job's `local_checkpoint_every` (the local tier's interval), likewise."""
    return _config_value(trainer_args, "local_checkpoint_every")


def _config_value(trainer_args: str, key: str) -> int | None:
    found = re.search(rf"(?<![a-z_]){key}=(\d+)", trainer_args or "")
    if found:
        return int(found.group(1))
    preset = re.search(r"--config[ =](\S+)", trainer_args or "")
    if preset is None:
        return None
    from trainer.config import load_config

    try:
        return getattr(load_config(preset.group(1)), key)
    except Exception:  # noqa: BLE001 - an unknown preset: the goal stays unjudged
        return None


def two_tiers(result: dict) -> bool:
    """The run's restarts could read a local tier (issue 50): it writes one, and its restores
    name their tier (a trainer from before the local tier names none)."""
    return bool(local_interval(result.get("trainer_args", ""))) and any(
        i.get("tier") for i in result.get("incidents", [])
    )


def losses(incs: list[dict]) -> list[Loss]:
    """The incidents with a restored step, for bench.steps_lost's judgement."""
    return [
        Loss(i["step_at_fault"], i["restored_from"], i.get("committed_before"))
        for i in incs
        if i["restored_from"] is not None and i["step_at_fault"] is not None
    ]


def figures(result: dict, where: str = "recovery run") -> list[Figure]:
    """Rows per fault kind: median, n and spread of every figure; every goal judged."""
    figs = []
    interval = checkpoint_interval(result.get("trainer_args", ""))
    tiers = two_tiers(result)
    if tiers and where == "recovery run":  # issue 50's rows: judged by their own rules
        where = "recovery run, two tiers"
    if result.get("api") == "compute":  # issue 51: the slice a Compute Engine group
        where += ", Compute Engine"
    local = local_interval(result.get("trainer_args", "")) if tiers else None
    kinds = dict.fromkeys(inc["kind"] for inc in result["incidents"])
    for kind in kinds:
        incs = [i for i in result["incidents"] if i["kind"] == kind]
        what, n = LABELS.get(kind, kind), len(incs)
        tag = f"({where})"
        det = [i["phases"]["detection"] for i in incs if "detection" in i["phases"]]
        if det:
            # a hang is a hang only once its heartbeat is HANG_S old: its goal starts there
            limit = 2.0 + (HANG_S if kind == "hang" else 0.0)
            note = "median; met only if every event is" + (
                f"; the heartbeat limit is {HANG_S:g} s" if kind == "hang" else ""
            )
            figs.append(
                Figure(f"detection, {what} {tag}", median(det), "s", f"<= {limit:g} s",
                       max(det) <= limit, n=len(det), spread=spread(det, "s"), note=note)
            )  # fmt: skip
        totals = [i["fault_to_first_step_s"] for i in incs if i["fault_to_first_step_s"]]
        total = median(totals)
        # The goal is a median of >= MIN_EVENTS: a run with fewer events of a kind (the goodput
        # run has one of each) reports its figure and leaves the judgement to `bench recovery`.
        enough = len(totals) >= MIN_EVENTS
        # With the local tier, issue 50's goals (the rules recovery-tiers-*), else the old one.
        limit = TIER_GOALS_S.get(kind, RECOVERY_GOAL_S) if tiers else RECOVERY_GOAL_S
        goal = f"<= {limit:g} s (median of >= {MIN_EVENTS})"
        figs.append(
            Figure(
                f"recovery, {what}: fault -> first step {tag}",
                total if total is not None else "not measured: no first step seen",
                "s" if total is not None else "",
                goal if enough else "",
                None if total is None or not enough else total <= limit,
                n=len(totals),
                spread=spread(totals, "s"),
                note="median"
                + (
                    ""
                    if enough
                    else f"; {len(totals)} event(s): the goal ({goal}) is judged "
                    "by `bench recovery`"
                )
                + "; local pod, 2 CPU workers; the largest phases are in the phases row",
            )
        )
        names = list(dict.fromkeys(k for i in incs for k in i["phases"]))
        med = {k: median([i["phases"].get(k) for i in incs]) for k in names}
        optional = OPTIONAL | ({"saved"} if kind != "notice" else set())
        missing = [
            p
            for k, p in PHASES.items()
            if all(k not in i["milestones"] for i in incs) and k not in optional
        ]
        text = " + ".join(f"{k} {v:.1f}" for k, v in med.items() if v is not None) + " s"
        if missing:
            text += f" (not separated: {', '.join(missing)})"
        figs.append(
            Figure(f"recovery phases, {what} {tag}", text, n=n, note="medians; " + PHASE_NOTE)
        )
        figs += recreate_shares(incs, what, tag)
        lost = [i["steps_lost"] for i in incs if i["steps_lost"] is not None]
        note = "each event, against the restored step; met only if every event is"
        if kind == "notice":
            goal, met = "0", (all(x == 0 for x in lost) if lost else None)
        elif local and kind in ("crash", "hang"):  # the VMs survive: the local tier's bound
            goal = f"<= {local} (the local tier's interval)"
            met = all(x <= local for x in lost) if lost else None
            read = Counter(i.get("tier") for i in incs)
            note += "; restored from " + ", ".join(f"{t} {c}" for t, c in read.items())
        else:
            goal = goal_text(interval) if interval else "<= 1 checkpoint interval"
            met, why = judge(losses(incs), interval)
            note += f"; {why}" if why else ""
        figs.append(
            Figure(
                f"steps lost, {what} {tag}",
                ", ".join(map(str, lost)) if len(lost) <= 5 else f"median {median(lost):g}",
                "steps",
                goal,
                met,
                n=len(lost),
                spread=spread([float(x) for x in lost], digits=0),
                note=note,
            )
        )
    figs.append(compile_cache_figure(result["incidents"], f"({where})"))
    return figs


def recreate_shares(incs: list[dict], what: str, tag: str) -> list[Figure]:
    """For faults that recreate the slice (cold workers: new disks): the cloud's share and
    tpupod's, per event, medians."""
    recreated = [i for i in incs if "re-creation" in i["phases"] and "bootstrap" in i["phases"]]
    if not recreated:
        return []
    ours = [round(sum(i["phases"].get(p, 0.0) for p in TPUPOD_SHARE), 3) for i in recreated]
    cloud = [round(sum(i["phases"].get(p, 0.0) for p in CLOUD_SHARE), 3) for i in recreated]
    return [
        Figure(f"cold recreate, {what}: tpupod's share (bootstrap -> first step) {tag}",
               median(ours), "s", f"<= {RECOVERY_GOAL_S:g} s", median(ours) <= RECOVERY_GOAL_S,
               n=len(ours), spread=spread(ours, "s"),
               note="median; cold workers (new disks: uv, the environment from the bucket); "
               "phases " + " + ".join(TPUPOD_SHARE)),
        Figure(f"cold recreate, {what}: the cloud's share (slice going away + re-creation) {tag}",
               median(cloud), "s", n=len(cloud), spread=spread(cloud, "s"),
               note="median; the local cloud's API, not GCP's (minutes there)"),
    ]  # fmt: skip


def compile_cache_figure(incs: list[dict], tag: str = "") -> Figure:
    """How often a restart on the pod loaded the compiled train step (trainer/compile_cache.py)."""
    hit = [i["phases"].get("compile") for i in incs if i.get("compile_cache_hit")]
    miss = [i["phases"].get("compile") for i in incs if i.get("compile_cache_hit") is False]
    hit, miss = [x for x in hit if x is not None], [x for x in miss if x is not None]
    text = f"{len(hit)} of {len(hit) + len(miss)} restarts loaded it"
    if hit:
        text += f"; compile phase {median(hit):.2f} s on a hit"
    if miss:
        text += f", {median(miss):.2f} s on a miss"
    name = f"compile cache on the pod (2 processes, per-process entries) {tag}".strip()
    return Figure(name, text, n=len(hit) + len(miss), spread=spread(hit, "s") if hit else "",
                  note="medians; the first start compiles; spread: hits")  # fmt: skip
