"""`python -m bench faults`: the seeded plan, the resumable state, the judged report (seconds),
and a 3-fault campaign on the local pod (e2e: minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import campaign


def test_plan_is_seeded_and_the_state_resumes_only_the_same_campaign(tmp_path: Path):
    assert campaign.plan(20, 7) == campaign.plan(20, 7) != campaign.plan(20, 8)
    assert set(campaign.plan(200, 0)) == set(campaign.MIX)  # every kind turns up
    path = tmp_path / "state.json"
    state = campaign.load_state(path, 4, 1, 2, "--config tiny")
    state["legs"].append({"faults": []})
    path.write_text(json.dumps(state))
    assert campaign.load_state(path, 4, 1, 2, "--config tiny")["legs"] == [{"faults": []}]
    assert campaign.load_state(path, 4, 2, 2, "--config tiny")["legs"] == []  # another seed


def _fault(kind, lost, rec, committed_lost=False):
    return {"kind": kind, "step": 100, "committed_before": 100, "restored_from": 100,
            "recovered": rec is not None, "committed_lost": committed_lost,
            "steps_lost": lost, "recovery_s": rec}  # fmt: skip


def test_report_judges_every_goal():
    leg = {"outcome": "done", "fingerprint_equal": True, "checkpoints": {"unreadable": [],
           "set_aside": [], "steps": [300]}, "faults": [  # fmt: skip
        _fault("notice", 0, 20.0), _fault("kill", 40, 18.0), _fault("kill", 230, 25.0),
        _fault("hang", 30, None)]}  # fmt: skip
    state = {"count": 4, "seed": 0, "trainer_args": "--config tiny --set checkpoint_every=100",
             "kinds": ["notice", "kill", "kill", "hang"], "legs": [leg]}  # fmt: skip
    r = campaign.summarise(state)
    assert r["kinds"]["kill"]["steps_lost"] == [40, 230] and r["committed_lost"] == 0
    rows = campaign.figures(r)
    figs = {f.name.split(" (")[0]: f for f in rows}
    assert figs["fault campaign: committed checkpoints lost or corrupt"].met is True
    # two saves outstanding (200 and 300): beyond the bound
    assert figs["fault campaign, no-notice kill: steps lost"].met is False
    assert figs["fault campaign, no-notice kill: steps lost"].spread == "40, 230"
    hang = next(f for f in rows if f.name.startswith("fault campaign, hang"))
    assert hang.value == "0 / 1" and hang.met is False
    assert all(f.met is not None for f in rows if f.goal)


@pytest.mark.e2e
@pytest.mark.slow  # eight minutes on 2 cores: `uv run pytest -m slow`, not in the default run
@pytest.mark.timeout(1200)
def test_the_hardest_faults_on_the_pod_lose_no_committed_checkpoint(tmp_path: Path):
    # seed 193: a hang, a kill whose watch dies mid-recovery, a kill during a save, and a kill
    # after which the newest checkpoint is damaged (the restore falls back one step)
    assert campaign.plan(4, 193) == ["hang", "watch-kill", "save-kill", "damaged-newest"]
    r = campaign.run(tmp_path, count=4, seed=193, per_leg=4, sets=("checkpoint_every=10",))
    assert r["injected"] == 4 and r["outcomes"] == ["done"], r
    assert all(k["recovered"] == k["injected"] for k in r["kinds"].values()), r["kinds"]
    assert r["committed_lost"] == 0 and r["unreadable"] == 0 and not r["check_errors"], r
    assert r["fingerprints_equal"], r
    events = json.loads((tmp_path / "faults" / "leg-1.json").read_text())["events"]
    assert any(e["event"] == "forensics" for e in events)  # the hang's stacks were kept
    killed = [i for i, e in enumerate(events) if e["event"] == "watch_killed"]
    assert len(killed) == 1 and events[killed[0] + 2]["event"] == "continuing", events[killed[0] :]
    damaged = [f for f in json.loads((tmp_path / "faults" / "leg-1.json").read_text())["injected"]
               if f["kind"] == "damaged-newest"]  # fmt: skip
    assert damaged and damaged[0]["damaged"] is not None, damaged
    fallbacks = [e for e in events if e["event"] == "checkpoint_fallback"]
    assert any(f"step {damaged[0]['damaged']} is unreadable" in e["message"] for e in fallbacks)
    assert r["damaged_set_aside"] == 1  # the damaged step, set aside (never deleted)
    again = campaign.run(tmp_path, count=4, seed=193, per_leg=4, sets=("checkpoint_every=10",))
    assert again.pop("legs_run_now") == 0 and r.pop("legs_run_now") == 1  # resumed: not run again
    assert again == r
