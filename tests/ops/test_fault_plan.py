"""The demo's fault plan: faults go in order, each once every worker reached its step and the
previous one was recovered; a fault the run ended before is reported as missed (the demo fails)."""

from __future__ import annotations

from ops.demo_observer import Fault, FaultPlan


def _plan(hits: list[str]) -> FaultPlan:
    faults = [
        Fault("hang", 40, lambda pod: hits.append("hang"), "hang of worker 1"),
        Fault("preemption", 60, lambda pod: hits.append("preemption"), "preemption, notice"),
    ]
    return FaultPlan(faults, pod=None)


def test_faults_go_in_order_and_one_the_run_ended_before_is_missed():
    hits: list[str] = []
    notes: list[tuple] = []
    plan = _plan(hits)
    assert plan.due([39, 45], settled=True) is None  # every worker must be at the step
    fault = plan.due([41, 45], settled=True)
    assert fault is not None and fault.kind == "hang"
    plan.inject(fault, 41, lambda *a, **k: notes.append((a, k)))
    assert hits == ["hang"] and notes[0][1] == {"kind": "hang", "step": 41}
    assert plan.due([70, 70], settled=False) is None  # the hang is not recovered yet
    assert [f.label for f in plan.missed()] == ["preemption, notice"]


def test_an_injection_that_fails_is_tried_again_not_counted():
    plan = _plan([])

    def refuse(pod):
        raise RuntimeError("slice is being recreated")

    plan.faults[0].inject = refuse
    notes: list[tuple] = []
    plan.inject(plan.faults[0], 41, lambda *a, **k: notes.append(a))
    assert notes[0][0] == "error" and "hang" not in plan.injected
    assert [f.kind for f in plan.missed()] == ["hang", "preemption"]
