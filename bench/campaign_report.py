"""The fault campaign's judgement (bench.campaign runs it): every leg's faults summed up per
kind, and the figures the rules campaign-* judge (bench/rules.py)."""

from __future__ import annotations

from bench.recovery_bench import LABELS, checkpoint_interval
from bench.report import Figure, median, spread
from bench.steps_lost import Loss, goal_text, judge


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
            # damage faults: how many damaged a step (one whose requests all failed was a kill)
            "damaged": sum(f.get("damaged") is not None for f in mine),
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
        "fingerprints_equal": bool(state["legs"])
        and all(leg["fingerprint_equal"] for leg in state["legs"]),
        "outcomes": [leg["outcome"] for leg in state["legs"]],
        "storage_errors": state.get("storage_errors", 0.0),
        "storage_injected": sum(
            sum(c.get("storage_faults", {}).get("injected", {}).values()) for c in checks
        ),
    }


def figures(r: dict) -> list[Figure]:
    what = f"{r['injected']} faults, seed {r['seed']}, {r['legs']} legs"
    corrupt = r["committed_lost"] + r["unreadable"]
    # A campaign stopped between legs is reported as it stands, never judged as a whole one.
    partial = r["injected"] < r["planned"]
    part = f"not complete: {r['injected']} of {r['planned']} faults, {r['legs']} legs"
    fingerprint = "yes" if r["fingerprints_equal"] else "no"
    figs = [
        Figure(
            f"fault campaign: committed checkpoints lost or corrupt ({what})",
            f"{part}: {corrupt}" if partial else corrupt,
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
            f"{part}: {fingerprint}" if partial else fingerprint,
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
        if kind.startswith("damaged"):  # shown, not judged: the rule was written without it
            also = f"; faults that damaged a committed step: {k.get('damaged', 0)} of {landed}"
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
