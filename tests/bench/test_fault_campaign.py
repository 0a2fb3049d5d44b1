"""`python -m bench faults`: the seeded plan, the resumable state, the judged report (seconds),
and the hardest faults in one short campaign on the local pod (e2e: minutes)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import campaign, campaign_report, faults, recovery_bench


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


def test_no_fault_is_injected_at_or_past_the_schedules_end_step(monkeypatch):
    """A fault needs steps after it to show its recovery; control: one step earlier it goes."""

    class Probe:
        alive = True

        def __init__(self, step: int):
            self.status = SimpleNamespace(state="training", step=step)

        def current(self, since):
            return self.status

    watcher = SimpleNamespace(state=SimpleNamespace(incident=None, since=0.0))
    for step, goes in ((100, False), (150, False), (99, True)):
        schedule = faults.Schedule(pod=None, kinds=["crash"], end_step=100)
        injected: list[int] = []
        monkeypatch.setattr(schedule, "inject", lambda w, kind, at, into=injected: into.append(at))
        schedule(watcher, [Probe(step)])
        assert injected == ([step] if goes else []), step


def test_a_save_in_flight_counts_as_saving_for_a_save_kill():
    """A periodic save a thread still writes (the newest save point passed, not yet committed)
    counts; controls: committed, before the first save point, no interval given, not training."""

    def probe(state: str, step: int, committed: int | None):
        return SimpleNamespace(status=SimpleNamespace(state=state, step=step,
                                                      last_checkpoint=committed))  # fmt: skip

    assert faults.saving([probe("saving", 7, None)])
    assert faults.saving([probe("training", 120, 50)], every=50)  # step 100's save in flight
    assert faults.saving([probe("training", 60, None)], every=50)  # the first one
    assert not faults.saving([probe("training", 120, 100)], every=50)  # committed
    assert not faults.saving([probe("training", 40, None)], every=50)  # no save point yet
    assert not faults.saving([probe("training", 120, 50)])  # no interval: the status alone
    assert not faults.saving([probe("compiling", 120, 50)], every=50)
    assert not faults.saving([SimpleNamespace(status=None), probe("training", 130, 100)], every=50)


def test_report_judges_every_goal():
    leg = {"outcome": "done", "fingerprint_equal": True, "checkpoints": {"unreadable": [],
           "set_aside": [], "steps": [300]}, "faults": [  # fmt: skip
        _fault("notice", 0, 20.0), _fault("kill", 40, 18.0), _fault("kill", 230, 25.0),
        _fault("hang", 30, None)]}  # fmt: skip
    state = {"count": 4, "seed": 0, "trainer_args": "--config tiny --set checkpoint_every=100",
             "kinds": ["notice", "kill", "kill", "hang"], "legs": [leg]}  # fmt: skip
    r = campaign_report.summarise(state)
    assert r["kinds"]["kill"]["steps_lost"] == [40, 230] and r["committed_lost"] == 0
    rows = campaign_report.figures(r)
    figs = {f.name.split(" (")[0]: f for f in rows}
    assert figs["fault campaign: committed checkpoints lost or corrupt"].met is True
    # two saves outstanding (200 and 300): beyond the bound
    assert figs["fault campaign, no-notice kill: steps lost"].met is False
    assert figs["fault campaign, no-notice kill: steps lost"].spread == "40, 230"
    hang = next(f for f in rows if f.name.startswith("fault campaign, hang"))
    assert hang.value == "0 / 1" and hang.met is False
    assert all(f.met is not None for f in rows if f.goal)


def test_a_restore_kill_counts_only_where_its_second_kill_hit_the_restore():
    def state(landed: str) -> dict:
        kill = {"state": "restoring", "state_at_kill": landed, "fired": 1.0}
        leg = {"outcome": "done", "fingerprint_equal": True, "faults": [
            _fault("restore-kill", 5, 20.0)], "checkpoints": {"steps": [300], "timed_kills": [kill]}}  # fmt: skip
        return {"count": 1, "seed": 0, "trainer_args": "--config tiny --set checkpoint_every=10",
                "kinds": ["restore-kill"], "legs": [leg]}  # fmt: skip

    def recovered(landed: str):
        r = campaign_report.summarise(state(landed))
        return next(
            f for f in campaign_report.figures(r) if f.name.endswith("recovered / injected")
        )

    assert recovered("restoring").met is True
    missed = recovered("compiling")  # the restore was over: not the fault the plan asked for
    assert missed.met is False and "while the job said `restoring`: 0" in missed.note


def test_a_damage_fault_whose_damage_failed_is_shown_as_a_kill():
    applied = {**_fault("damaged-newest", 50, 20.0), "damaged": 150}
    failed = {**_fault("damaged-newest", 50, 20.0), "damaged": None}  # its requests all failed
    leg = {"outcome": "done", "fingerprint_equal": True, "faults": [applied, failed],
           "checkpoints": {"steps": [300], "set_aside": ["150.unreadable-x"]}}  # fmt: skip
    state = {"count": 2, "seed": 0, "trainer_args": "--config tiny --set checkpoint_every=50",
             "kinds": ["damaged-newest"] * 2, "legs": [leg]}  # fmt: skip
    r = campaign_report.summarise(state)
    assert r["kinds"]["damaged-newest"]["damaged"] == 1 and r["damaged_set_aside"] == 1
    row = next(f for f in campaign_report.figures(r) if f.name.endswith("recovered / injected"))
    assert "faults that damaged a committed step: 1 of 2" in row.note and row.met is True


# The hardest faults, each once in one 2-worker run: a SIGKILL during an async save, a SIGKILL
# during the restore, the watch SIGKILLed mid-recovery, and a damaged newest checkpoint. In CI,
# with the slice staying (a crash of worker 0's job: a restart), the two that no other CI test
# makes on the pod: the kill during a save and the kill during the restore (CI has a SIGKILL
# mid-save in test_trainer_resume.py, damaged steps in test_checkpoint_verify.py, a killed watch
# in tests/e2e/test_watcher.py). All four with the slice staying, and all four with the slice
# preempted, are `slow` (4-5 minutes each against CI's 20) and run in the 100-fault campaign.
HARDEST_STAYING = ["save-crash", "restore-kill", "watch-crash", "damaged-crash"]
HARDEST = ["save-kill", "restore-kill", "watch-kill", "damaged-newest"]
SAVES, WATCHES, DAMAGES = ("save-crash", "save-kill"), ("watch-crash", "watch-kill"), (
    "damaged-crash", "damaged-newest")  # fmt: skip
# A save every 10 steps; each fault 20 steps after the last recovery, and 15 steps of slack for
# it to be injected (a save fault waits for a poll to see a save): 35 steps a fault. A fault the
# run ended before fails the test (every one injected). 10 steps after the last, so that its
# recovery's first step is seen before the run ends (with none, a restore-kill injected at step
# 66 of 70 resumed at 66 and the run was done within a second: not counted as recovered).
SHORT = {"sets": ("checkpoint_every=10",), "min_steps": 20, "slack": 15, "tail": 10}


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_kill_in_a_save_and_in_the_restore_lose_no_committed_checkpoint(tmp_path: Path):
    assert_hardest_faults_survived(tmp_path, ["save-crash", "restore-kill"])


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_hardest_faults_on_the_pod_lose_no_committed_checkpoint(tmp_path: Path):
    assert_hardest_faults_survived(tmp_path, HARDEST_STAYING)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_hardest_faults_with_the_slice_preempted_lose_no_committed_checkpoint(tmp_path):
    assert_hardest_faults_survived(tmp_path, HARDEST)


def assert_hardest_faults_survived(tmp_path: Path, kinds: list[str]) -> None:
    n = len(kinds)
    r = campaign.run(tmp_path, per_leg=n, kinds=kinds, **SHORT)
    assert r["injected"] == n and r["outcomes"] == ["done"], r
    assert all(k["recovered"] == k["injected"] == 1 for k in r["kinds"].values()), r["kinds"]
    assert r["committed_lost"] == 0 and r["unreadable"] == 0 and not r["check_errors"], r
    assert r["fingerprints_equal"], r
    leg = json.loads((tmp_path / "faults" / "leg-1.json").read_text())
    events = leg["events"]
    kills = leg["checks"]["timed_kills"]
    for save in set(kinds) & set(SAVES):
        saving = [e for e in events if e["event"] == "injected" and e["fault"] == save]
        assert len(saving) == 1, events
        if save == "save-crash":  # a kill armed for the job's next save, 50 ms into it: it fired
            (at_save,) = [k for k in kills if k["state"] == "saving"]
            assert at_save["fired"] and not at_save["error"], at_save
    if "restore-kill" in kinds:  # the second SIGKILL landed while the restarted job restored
        (kill,) = [k for k in kills if k["state"] == "restoring"]
        assert kill["state_at_kill"] == "restoring", kill
        assert r["killed_restoring"] == 1
    if set(kinds) & set(WATCHES):  # the watch died mid-recovery, a new one went on with it
        killed = [i for i, e in enumerate(events) if e["event"] == "watch_killed"]
        assert len(killed) == 1 and events[killed[0] + 2]["event"] == "continuing", events
    for damage in set(kinds) & set(DAMAGES):  # one line, set aside (never deleted), the step
        (damaged,) = [f for f in leg["injected"] if f["kind"] == damage]  # before restored
        assert damaged["damaged"] is not None, damaged
        fallbacks = [e for e in events if e["event"] == "checkpoint_fallback"]
        assert any(f"step {damaged['damaged']} is unreadable" in e["message"] for e in fallbacks)
        assert r["damaged_set_aside"] == 1 and r["kinds"][damage]["damaged"] == 1
    again = campaign.run(tmp_path, per_leg=n, kinds=kinds, **SHORT)
    assert again.pop("legs_run_now") == 0 and r.pop("legs_run_now") == 1  # resumed: not run again
    assert again == r


def test_a_campaign_asked_for_no_leg_now_runs_none_and_proves_nothing(tmp_path: Path):
    r = campaign.run(tmp_path, count=8, per_leg=4, legs_now=0)  # no pod: nothing saved yet
    assert r["legs_run_now"] == 0 and r["injected"] == 0 and r["planned"] == 8
    figs = {f.name.split(" (")[0]: f for f in campaign_report.figures(r)}
    assert figs["fault campaign: committed checkpoints lost or corrupt"].met is False
    assert figs["fault campaign: final fingerprint equals the uninterrupted run"].met is False
    assert all(f.value.startswith("not complete: 0 of 8 faults") for f in figs.values())


def _status(t: float, worker: int, pid: int, committed: int) -> dict:
    return {"t": t, "worker": worker, "pid": pid, "last_checkpoint": committed}


def test_committed_before_is_the_running_trainers_not_a_set_aside_steps():
    # trainers 1/2 committed 550; a fault damaged 550, the restore set it aside and the new
    # trainers (3/4) restored 500 and have committed nothing newer when the next fault comes
    status = [_status(10, 0, 1, 550), _status(10, 1, 2, 550),
              _status(20, 0, 3, 500), _status(20, 1, 4, 500)]  # fmt: skip
    assert recovery_bench.committed_before(status, t0=30) == 500
    # negative control: the running trainers committed 550 themselves; a restore from 500
    # after this fault loses it
    status += [_status(25, 0, 3, 550), _status(25, 1, 4, 550)]
    assert recovery_bench.committed_before(status, t0=30) == 550
    assert recovery_bench.committed_before(status, t0=5) is None  # nothing reported yet
