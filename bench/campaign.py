"""The fault campaign: `uv run python -m bench faults --count 100 [--seed S]`.

A seeded random mix of faults (localpod.faults.KINDS: notices, kills, crashes, hangs, kills during a
save, stockouts on the re-create, watch kills mid-recovery, a damaged newest checkpoint) goes into long `tiny` runs on the
local pod through the real `watch`, one fault whenever the job is healthy again and has stepped
past one more checkpoint. The campaign runs in legs (`--per-leg` faults each, one pod run: the
pod's GCS is in memory, so a run cannot outlive its pod); after every leg its
result goes to bench/out/faults/state.json, and a campaign started again with the same count and
seed goes on with the next leg (resumable). `--per-leg` = `--count` makes it one run. Every leg
runs the same job (same steps, seed, policy), so one uninterrupted reference serves them all: the
first leg runs it, state.json keeps its summary, and every leg's final weights are compared to it.

Per fault: recovered or not, steps lost, recovery time (fault -> first step; for hangs detection
-> first step), and whether a committed checkpoint was lost: the newest committed step the
trainers reported before the fault must be the one (or older than the one) the next trainer
restores from; a restore that falls back past an unreadable step fails that check too. At the end
of each leg every checkpoint step the bucket still holds is read in full (ops.checkpoints).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench.podrun import RunRecord, run_on_pod
from bench.recovery_bench import HANG_S, LABELS, checkpoint_interval, incidents
from bench.report import Figure, median, spread
from bench.steps_lost import Loss, goal_text, judge
from localpod import faults
from localpod.faults import KINDS
from ops.target import write_atomic

# Fault kind -> weight in the random mix.
MIX = {"notice": 3, "kill": 3, "crash": 2, "hang": 2, "save-kill": 2, "stockout": 1,
       "watch-kill": 1, "damaged-newest": 1, "restore-kill": 1}  # fmt: skip
assert set(MIX) <= set(KINDS)


def plan(count: int, seed: int) -> list[str]:
    """The campaign's faults, in order: the same for the same count and seed."""
    rng = random.Random(seed)
    return rng.choices(list(MIX), weights=list(MIX.values()), k=count)


def load_state(
    path: Path,
    count: int,
    seed: int,
    per_leg: int,
    args: str,
    kinds: list[str] | None = None,
    workers: int = 2,
    storage_errors: float = 0.0,
) -> dict:
    """The saved campaign if it is this one (same faults, legs, job and pod), else a new one.
    `kinds`: the faults in order, instead of the seeded plan (a campaign of chosen faults)."""
    fresh = {"count": count, "seed": seed, "per_leg": per_leg, "trainer_args": args,
             "kinds": kinds or plan(count, seed), "workers": workers,
             "storage_errors": storage_errors, "legs": []}  # fmt: skip
    if path.exists():  # older states: 2 workers, no storage errors
        saved = {"workers": 2, "storage_errors": 0.0, **json.loads(path.read_text())}
        keys = ("count", "seed", "per_leg", "trainer_args", "kinds", "workers", "storage_errors")
        same = all(saved.get(k) == fresh[k] for k in keys)
        if same:
            return saved
    return fresh


def end_of_leg(pod) -> dict:
    """What the pod holds at a leg's end: its checkpoints surveyed, and the timed kills (a
    restore-kill's second SIGKILL: whether it landed while the job was restoring)."""
    return {**survey_checkpoints(pod), "timed_kills": pod.timed_kills(),
            "storage_faults": pod.storage_faults()}  # fmt: skip


def survey_checkpoints(pod) -> dict:
    """Every step the job's workdir still holds, read in full: (un)readable and set aside."""
    import argparse

    from ops.checkpoints import locate, survey

    try:
        args = argparse.Namespace(stack="local", pod_dir=pod.paths.root, workdir=None)
        reports = survey(locate(args), read_values=True)
    except Exception as err:  # noqa: BLE001 - the check's own failure is reported, not fatal
        return {"error": f"{type(err).__name__}: {err}"[:300]}
    return {
        "steps": [r.step for r in reports if r.committed and not r.set_aside],
        "unreadable": [r.name for r in reports if r.committed and r.readable is False],
        "set_aside": [r.name for r in reports if r.set_aside],
    }


def leg_result(record: RunRecord, reference: dict | None, interval: int = 0) -> dict:
    """One leg's faults, each judged, and the leg's end state (fingerprint, checkpoints). A step
    the fault itself damaged (damaged-newest) is not the trainers' to keep: the one before it
    (`interval` steps earlier) is the newest committed step that must be restored."""
    faults = []
    for fault, inc in zip(record.injected, incidents(record), strict=True):
        before = inc["committed_before"]
        if fault.get("damaged") is not None and before == fault["damaged"]:
            before -= interval
        restored = inc["restored_from"]
        m = inc["milestones"]
        start = m.get("detected") if fault["kind"] == "hang" else m["injected"]
        first = m.get("first_step")
        faults.append(
            {
                "kind": fault["kind"],
                "step": fault["step"],
                "step_at_fault": inc["step_at_fault"],
                "committed_before": before,
                "restored_from": restored,
                "recovered": first is not None,
                "committed_lost": restored is not None and before is not None and restored < before,
                "steps_lost": inc["steps_lost"],
                "recovery_s": first - start if first is not None and start else None,
                "damaged": fault.get("damaged"),  # the step the fault itself damaged
            }
        )
    fp = (record.summary or {}).get("params_fingerprint")
    ref = (reference or {}).get("params_fingerprint")
    return {
        "outcome": record.exit,
        "faults": faults,
        "final_step": (record.summary or {}).get("final_step"),
        "fingerprint": fp,
        "reference_fingerprint": ref,
        "fingerprint_equal": bool(fp and ref and fp == ref),
        "checkpoints": record.checks,
    }


def run(
    out_dir: Path,
    count: int = 100,
    seed: int = 0,
    per_leg: int = 25,
    preset: str = "tiny",
    sets: tuple[str, ...] = ("checkpoint_every=100",),
    notice: float = 30.0,
    console=None,
    kinds: list[str] | None = None,
    min_steps: int | None = None,
    slack: int = 60,
    tail: int = 300,
    workers: int = 2,
    storage_errors: float = 0.0,
) -> dict:
    """`kinds`: these faults in order instead of `count` drawn by `seed`; `min_steps`: steps
    between a recovery and the next fault (default: a checkpoint interval + 50, so every fault
    finds a newer committed step to lose); the job's steps are `min_steps + slack` per fault
    (a fault waits for a healthy poll, a save-kill for a save) and `tail` more;
    `storage_errors`: the share of the bucket's requests that fail (429, 503, dropped) in
    every leg, from the pod's up to its end (the boots' downloads and the reference included)."""
    if kinds is not None:
        for kind in kinds:
            faults.kind_of(kind)  # an unknown kind: one line, before any pod starts
        count = len(kinds)
    interval = checkpoint_interval(" ".join(f"--set {s}" for s in sets)) or 100
    min_steps = interval + 50 if min_steps is None else min_steps
    steps = per_leg * (min_steps + slack) + tail
    args = " ".join([f"--config {preset} --steps {steps}", *(f"--set {s}" for s in sets)])
    storage = {"rate": storage_errors, "kinds": ["429", "503", "drop"], "seed": seed}
    folder = out_dir / "faults"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "state.json"
    state = load_state(path, count, seed, per_leg, args, kinds, workers, storage_errors)
    legs = [state["kinds"][i : i + per_leg] for i in range(0, count, per_leg)]
    done_before = len(state["legs"])
    for index in range(done_before, len(legs)):
        if console is not None:
            console.print(f"fault campaign leg {index + 1}/{len(legs)}: {', '.join(legs[index])}")
        record = run_on_pod(
            folder / "pod",
            args,
            {"kinds": legs[index], "min_steps": min_steps},
            workers=workers,
            storage_faults=storage if storage_errors else None,
            notice=notice,
            reference="reference" not in state,
            references=(),
            hang=HANG_S,
            after=end_of_leg,
            console=console,
        )
        record.save(folder / f"leg-{index + 1}.json")
        if record.reference is not None:
            state["reference"] = record.reference
        state["legs"].append(leg_result(record, state.get("reference"), interval))
        write_atomic(path, state, indent=1)
    result = summarise(state)
    result["legs_run_now"] = len(state["legs"]) - done_before
    result["last_leg_saved"] = path.stat().st_mtime if path.exists() else None
    return result


def summarise(state: dict) -> dict:
    faults = [f for leg in state["legs"] for f in leg["faults"]]
    kinds = {}
    for kind in dict.fromkeys(f["kind"] for f in faults):
        mine = [f for f in faults if f["kind"] == kind]
        kinds[kind] = {
            "injected": len(mine),
            "recovered": sum(f["recovered"] for f in mine),
            "committed_lost": sum(f["committed_lost"] for f in mine),
            "steps_lost": [f["steps_lost"] for f in mine if f["steps_lost"] is not None],
            "losses": [
                # campaigns saved before step_at_fault was kept: restored + steps lost is it
                [
                    f.get("step_at_fault") or f["restored_from"] + f["steps_lost"],
                    f["restored_from"],
                    f["committed_before"],
                ]
                for f in mine
                if f["steps_lost"] is not None and f["restored_from"] is not None
            ],
            "recovery_s": [f["recovery_s"] for f in mine if f["recovery_s"] is not None],
        }
    checks = [leg["checkpoints"] for leg in state["legs"]]
    # A step a fault of the same leg damaged on purpose is set aside by design; any other is a
    # finding (each leg is a run of its own: step numbers repeat across legs).
    expected = [name for leg in state["legs"]
                for name in leg["checkpoints"].get("set_aside", [])
                if int(name.split(".")[0]) in {f.get("damaged") for f in leg["faults"]}]  # fmt: skip
    aside = [name for c in checks for name in c.get("set_aside", [])]
    return {
        "count": state["count"],
        "seed": state["seed"],
        "trainer_args": state["trainer_args"],
        "planned": len(state["kinds"]),
        "injected": len(faults),
        "legs": len(state["legs"]),
        "kinds": kinds,
        "committed_lost": sum(f["committed_lost"] for f in faults),
        "unreadable": sum(len(c.get("unreadable", [])) for c in checks)
        + len(aside)
        - len(expected),
        "damaged_set_aside": len(expected),
        "check_errors": [c["error"] for c in checks if "error" in c],
        # restore-kills whose second SIGKILL landed while the job said `restoring`
        "killed_restoring": sum(
            k.get("state_at_kill") == "restoring" for c in checks for k in c.get("timed_kills", [])
        ),
        "fingerprints_equal": all(leg["fingerprint_equal"] for leg in state["legs"]),
        "outcomes": [leg["outcome"] for leg in state["legs"]],
        "storage_errors": state.get("storage_errors", 0.0),
        "storage_injected": sum(
            sum(c.get("storage_faults", {}).get("injected", {}).values()) for c in checks
        ),
    }


def figures(r: dict) -> list[Figure]:
    what = f"{r['injected']} faults, seed {r['seed']}, {r['legs']} legs"
    corrupt = r["committed_lost"] + r["unreadable"]
    figs = [
        Figure(
            f"fault campaign: committed checkpoints lost or corrupt ({what})",
            corrupt,
            n=r["injected"],
            goal="0",
            met=corrupt == 0 and not r["check_errors"] and r["injected"] == r["planned"],
            note=f"restores older than the newest committed step: {r['committed_lost']}; steps "
            f"unreadable or set aside at the end of each leg: {r['unreadable']}"
            + (f"; check errors: {'; '.join(r['check_errors'])}" if r["check_errors"] else "")
            + (
                f"; only {r['injected']} of {r['planned']} injected"
                if r["injected"] < r["planned"]
                else ""
            )  # fmt: skip
            + f"; job: {r['trainer_args']}"
            + (
                f"; the bucket failed {r['storage_errors']:.0%} of requests (429, 503, dropped): "
                f"{r['storage_injected']} failures injected"
                if r.get("storage_errors")
                else ""
            ),
        ),
        Figure(
            f"fault campaign: final fingerprint equals the uninterrupted run ({what})",
            "yes" if r["fingerprints_equal"] else "no",
            n=r["legs"],
            goal="yes",
            met=r["fingerprints_equal"] and all(o == "done" for o in r["outcomes"]),
            note=f"each leg against one uninterrupted run of the same job; outcomes: "
            f"{', '.join(r['outcomes'])}",
        ),
    ]
    interval = checkpoint_interval(r["trainer_args"])
    for kind, k in r["kinds"].items():
        label = LABELS.get(kind, kind)
        rec, lost = k["recovery_s"], k["steps_lost"]
        landed, also = k["injected"], ""
        if kind == "restore-kill":  # it counts only where the second SIGKILL hit the restore
            landed = r.get("killed_restoring", 0)
            also = f"; second kills that landed while the job said `restoring`: {landed}"
        figs.append(
            Figure(
                f"fault campaign, {label}: recovered / injected",
                f"{k['recovered']} / {k['injected']}",
                n=k["injected"],
                goal="all",
                met=k["recovered"] == k["injected"] == landed,
                note=f"committed checkpoints lost: {k['committed_lost']}{also}",
            )
        )
        worst = max(rec) if rec else None
        figs.append(
            Figure(
                f"fault campaign, {label}: recovery"
                + (" (detection -> first step)" if kind == "hang" else " (fault -> first step)"),
                median(rec) if rec else "not measured",
                "s" if rec else "",
                n=len(rec),
                spread=spread(rec, "s"),
                note=f"median; worst {worst:.1f} s" if worst is not None else "",
            )
        )
        if kind == "notice":
            goal, met, why = "0", (max(lost) == 0 if lost else None), ""
        else:
            goal = goal_text(interval) if interval else "<= 1 checkpoint interval"
            met, why = judge([Loss(*x) for x in k["losses"]], interval)
        figs.append(
            Figure(
                f"fault campaign, {label}: steps lost",
                median(lost) if lost else "not measured",
                "steps" if lost else "",
                goal,
                met,
                n=len(lost),
                spread=spread([float(x) for x in lost], digits=0),
                note=f"median; worst {max(lost)}; met: every fault" + (f"; {why}" if why else "")
                if lost
                else "",
            )
        )
    return figs
