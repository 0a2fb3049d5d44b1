"""`tpupod goodput` from the watcher's journal (ops.watch.goodput): the figures worked by hand on
a journal whose every number is known, the step time kept clear of recoveries, the watcher's
progress samples, and the command's answers."""

from __future__ import annotations

import json

import pytest

from ops.cli import main
from ops.fleet.job_status import JobRules
from ops.watch.goodput import measure, step_seconds
from ops.watch.incident import Incident, WatchState
from ops.watch.journal import Journal
from ops.watch.progress import Progress


def run_journal() -> list[dict]:
    """2 s a step; watch starts at t=0, the first step at t=20 (startup); a crash at t=220
    (step 100) is recovered by t=250, 10 steps lost; done at step 200 at t=470."""
    ev = [{"time": 0.0, "event": "watching"}]
    ev += [{"time": 20.0 + 2 * s, "event": "progress", "step": s} for s in (0, 50, 100)]
    ev += [{"time": 220.0, "event": "detected", "kind": "crash"},
           {"time": 250.0, "event": "resumed", "recovery_s": 30.0, "steps_lost": 10, "step": 90},
           {"time": 270.0, "event": "progress", "step": 90},  # the restore and compile in between
           {"time": 370.0, "event": "progress", "step": 140},
           {"time": 470.0, "event": "done", "step": 200}]  # fmt: skip
    return ev


def test_the_figures_worked_by_hand():
    result = measure(run_journal(), now=1e9)
    assert result.step_s == pytest.approx(2.0) and result.final_step == 200
    assert result.wall_s == 470.0 and result.finished and result.incidents == 1
    assert result.seconds == pytest.approx({"productive": 400.0, "infrastructure recovery": 30.0,
                                            "wasted progress": 20.0, "other": 20.0})  # fmt: skip
    assert result.goodput == pytest.approx(400 / 470)
    assert sum(result.seconds.values()) == pytest.approx(result.wall_s)


def test_a_pair_of_samples_across_a_recovery_is_no_step_time():
    """Steps 0 and 50 at 2 s a step, then a recovery, then step 140 at t=370. The pair
    (50 -> 140) spans the recovery: 250 s for 90 steps is no step's time. Negative control:
    without the `detected` between them, the median takes it in."""
    keep = {("progress", 0), ("progress", 50), ("progress", 140), ("detected", None),
            ("resumed", 90), ("watching", None)}  # fmt: skip
    journal = [r for r in run_journal() if (r["event"], r.get("step")) in keep]
    assert step_seconds(journal) == pytest.approx(2.0)
    without_detection = [r for r in journal if r["event"] != "detected"]
    assert step_seconds(without_detection) == pytest.approx((2.0 + 250 / 90) / 2)


def test_an_unfinished_run_counts_its_open_incident_to_now():
    journal = run_journal()[:5]  # watching, 3 samples, detected at 220
    result = measure(journal, now=300.0)
    assert not result.finished and result.seconds["infrastructure recovery"] == 80.0


def test_the_watcher_samples_progress_at_most_every_interval_and_not_in_an_incident():
    state, journal = WatchState(), Journal(None)
    progress = Progress(state, journal, JobRules(), every=10.0)
    for now, step in ((100.0, 1), (105.0, 2), (111.0, 3), (111.5, 3)):
        state.last_step = step
        progress._journal_progress(now)
    assert [e["step"] for e in journal.events if e["event"] == "progress"] == [1, 3]
    state.incident = Incident("crash", "x", 120.0, 3)
    state.last_step = 9
    progress._journal_progress(200.0)
    assert [e["step"] for e in journal.events] == [1, 3]


def test_the_command_reads_a_journal_file(tmp_path, capsys):
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in run_journal()))
    assert main(["goodput", "--journal", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["goodput"] == pytest.approx(400 / 470) and doc["incidents"] == 1
    assert main(["goodput", "--journal", str(path)]) == 0
    assert "goodput 85.1%" in capsys.readouterr().out


def test_a_missing_journal_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["goodput", "--journal", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file" in err[0], err


def test_a_stacks_journal_of_two_runs_measures_the_newest():
    """The bucket keeps one journal per stack: a second run follows the first's `done`."""
    first = run_journal()
    second = [{**r, "time": r["time"] + 1000.0} for r in run_journal()]
    second[-1] = {**second[-1], "step": 200}
    result = measure(first + second, now=1e9)
    assert result.wall_s == 470.0 and result.incidents == 1
    running = first + second[:5]  # the second run still under way at t=1300
    assert measure(running, now=1300.0).wall_s == 300.0


def test_a_watch_that_began_mid_run_counts_the_steps_it_saw():
    journal = [{"time": 0.0, "event": "watching"}]
    journal += [{"time": 2.0 * s, "event": "progress", "step": 100 + s} for s in (0, 10, 20, 30)]
    journal.append({"time": 60.0, "event": "done", "step": 130})
    assert measure(journal, now=1e9).seconds["productive"] == 60.0  # 30 steps, not 130
