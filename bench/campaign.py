"""The fault campaign: `uv run python -m bench faults --count 100 [--seed S]` (judged in
bench.campaign_report).

A seeded random mix of faults (localpod.faults.KINDS: notices, kills, crashes, hangs, kills
during a save, stockouts on the re-create, watch kills mid-recovery, a damaged newest checkpoint,
crashes whose restart is killed mid-restore) goes into long `tiny` runs on the local pod through
the real `watch`, one fault whenever the job is healthy again and has stepped past one more
checkpoint; with `--storage-errors R` the bucket also fails a share R of all requests (429, 503,
dropped connections) through every leg. The campaign runs in legs (`--per-leg` faults each, one pod run: the
pod's GCS is in memory, so a run cannot outlive its pod); after every leg its
result goes to bench/out/faults/state.json, and a campaign started again with the same count and
seed goes on with the next leg (resumable). `--per-leg` = `--count` makes it one run. Every leg
runs the same job (same steps, seed, policy), so one uninterrupted reference serves them all: the
first leg runs it, state.json keeps its summary, and every leg's final weights are compared to it.

Per fault: recovered or not, steps lost, recovery time (fault -> first step; for hangs detection
-> first step), and whether a committed checkpoint was lost: the newest committed step the
trainers reported before the fault must be the one (or older than the one) the next trainer
restores from; a restore that falls back past an unreadable step fails that check too. At the end
of each leg every checkpoint step the bucket still holds is read in full (ops.commands.checkpoints).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from bench.campaign_report import summarise
from bench.podrun import RunRecord, run_on_pod
from bench.recovery_bench import HANG_S, checkpoint_interval, incidents
from bench.trainer_bench import REPO
from localpod import faults
from localpod.faults import KINDS
from ops.json_file import write_atomic

SURVEY_TIMEOUT_S = 600  # every step of a leg read in full
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
    """Every step the job's workdir still holds, read in full (`tpupod checkpoints --json`):
    (un)readable and set aside. In a process of its own: tensorstore keeps one Google auth
    provider per process, made with the token it first read, so a survey in the campaign's
    process sent the first leg's pod token to every later leg's emulator, which refused it, and
    every step of those legs read as unreadable (2026-12-05's campaign)."""
    command = [sys.executable, "-m", "ops", "checkpoints", "--stack", "local",
               "--pod-dir", str(pod.paths.root), "--json"]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SURVEY_TIMEOUT_S,
                              cwd=REPO)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"tpupod checkpoints: no answer in {SURVEY_TIMEOUT_S} s"}
    try:
        reports = json.loads(done.stdout.strip().splitlines()[-1])["steps"]
    except (ValueError, IndexError, KeyError):  # the check's own failure is reported, not fatal
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {"error": f"tpupod checkpoints: {why}"[:300]}
    return {
        "steps": [r["step"] for r in reports if r["committed"] and not r["set_aside"]],
        "unreadable": [r["name"] for r in reports if r["committed"] and r["readable"] is False],
        "set_aside": [r["name"] for r in reports if r["set_aside"]],
        "problems": {r["name"]: r["problem"] for r in reports if r["problem"]},
    }


def leg_result(record: RunRecord, reference: dict | None, interval: int = 0) -> dict:
    """One leg's faults, each judged, and the leg's end state (fingerprint, checkpoints). A step
    the fault itself damaged (damaged-newest) is not the trainers' to keep: the committed step
    behind it (as the fault listed it; legs from before that record: `interval` steps earlier)
    is the newest committed step that must be restored."""
    faults = []
    for fault, inc in zip(record.injected, incidents(record), strict=True):
        before = inc["committed_before"]
        if fault.get("damaged") is not None and before == fault["damaged"]:
            before = fault["behind"] if "behind" in fault else before - interval
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
    legs_now: int | None = None,
) -> dict:
    """`legs_now`: run at most this many of the legs still to run (0: report what is saved);
    `kinds`: these faults in order instead of `count` drawn by `seed`; `min_steps`: steps
    between a recovery and the next fault (default: a checkpoint interval + 50, so every fault
    finds a newer committed step to lose); the job's steps are `min_steps + slack` per fault
    (a fault waits for a healthy poll, a save-kill for a save) and `tail` more, the last half
    of it free of faults (each needs steps after it to show its recovery);
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
    last = len(legs) if legs_now is None else min(len(legs), done_before + legs_now)
    for index in range(done_before, last):
        if console is not None:
            console.print(f"fault campaign leg {index + 1}/{len(legs)}: {', '.join(legs[index])}")
        record = run_on_pod(
            folder / "pod",
            args,
            {
                "kinds": legs[index],
                "min_steps": min_steps,
                "end_step": steps - tail // 2,
                "save_every": interval,
            },
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
