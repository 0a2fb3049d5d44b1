"""The demo's fault plan: faults go in order, each once every worker reached its step and the
previous one was recovered; a fault the run ended before is reported as missed (the demo fails)."""

from __future__ import annotations

import pytest

from demo.observer import Fault, FaultPlan
from localpod import faults
from localpod.faults import STOCKOUT_CREATES


class _Pod:
    """Records what the faults do to it (the LocalPod calls they make)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def hang(self, worker):
        self.calls.append(("hang", worker))

    def preempt(self, notice, wait):
        self.calls.append(("preempt", notice))

    def inject_stockout(self, count, zone=None):
        self.calls.append(("stockout", count, zone))


def _plan(pod) -> FaultPlan:
    return FaultPlan([Fault("hang", 40, worker=1), Fault("stockout", 60, notice=30.0)], pod=pod)


def test_faults_go_in_order_and_one_the_run_ended_before_is_missed():
    pod, notes = _Pod(), []
    plan = _plan(pod)
    assert plan.due([39, 45], settled=True) is None  # every worker must be at the step
    fault = plan.due([41, 45], settled=True)
    assert fault is not None and fault.kind == "hang" and fault.incident == "hang"
    plan.inject(fault, 41, lambda *a, **k: notes.append((a, k)))
    assert pod.calls == [("hang", 1)]
    assert notes[0][1] == {"kind": "hang", "step": 41, "fault": "hang"}
    assert "worker 1" in notes[0][0][1]
    assert plan.due([70, 70], settled=False) is None  # the hang is not recovered yet
    (missed,) = plan.missed()
    assert missed.incident == "preemption" and "30 s notice" in missed.label
    plan.inject(missed, 70, lambda *a, **k: None)
    assert pod.calls[1:] == [("stockout", STOCKOUT_CREATES, "node"), ("preempt", 30.0)]


def test_an_injection_that_fails_is_tried_again_not_counted():
    plan = _plan(_Pod())

    def refuse(pod):
        raise RuntimeError("slice is being recreated")

    plan.faults[0].inject = refuse
    notes: list[tuple] = []
    plan.inject(plan.faults[0], 41, lambda *a, **k: notes.append(a))
    assert notes[0][0] == "error" and "hang" not in plan.injected
    assert [f.kind for f in plan.missed()] == ["hang", "stockout"]


def test_one_vocabulary_and_an_unknown_kind_is_refused():
    assert {"notice", "kill", "crash", "hang", "save-kill", "stockout", "watch-kill",
            "damaged-newest", "restore-kill", "save-crash", "watch-crash",
            "damaged-crash"} == set(faults.KINDS)  # fmt: skip
    with pytest.raises(ValueError, match="unknown fault 'preemption'"):
        Fault("preemption", 10)
