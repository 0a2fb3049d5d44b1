"""Issue 50's recovery rows: a run whose restores name their tier reports "(recovery run, two
tiers)" rows, judged by the rules registered for them (crash and hang <= 5 s, notice and kill
<= 8 s, crash and hang steps lost <= the local tier's interval); a run before the local tier keeps
its rows. Built from synthetic incidents: the pod run itself is `bench recovery`."""

from __future__ import annotations

from bench import rules
from bench.recovery_bench import figures


def incident(kind: str, seconds: float, lost: int, tier: str | None) -> dict:
    return {"kind": kind, "phases": {"detection": 0.1}, "milestones": {"injected": 0.0},
            "fault_to_first_step_s": seconds, "steps_lost": lost, "restored_from": 20,
            "step_at_fault": 20 + lost, "committed_before": 20, "tier": tier,
            "compile_cache_hit": True}  # fmt: skip


def rows(tier: str | None, crash_lost: int) -> dict:
    incs = [incident("crash", 3.0, crash_lost, tier) for _ in range(3)]
    incs += [incident("hang", 12.0, 1, tier) for _ in range(3)]
    result = {"trainer_args": "--config tiny --steps 1000000", "incidents": incs}
    return {f.name: f for f in figures(result)}


def test_two_tier_rows_are_judged_by_issue_50s_rules():
    found = rows("local", crash_lost=1)
    crash = "recovery, crash: fault -> first step (recovery run, two tiers)"
    hang = "recovery, hang: fault -> first step (recovery run, two tiers)"
    assert rules.rule_for(crash).key == "recovery-tiers-survive"
    assert rules.rule_for(hang).key == "recovery-tiers-survive"
    lost = found["steps lost, crash (recovery run, two tiers)"]
    assert rules.rule_for(lost.name).key == "steps-lost-tiers"
    assert lost.goal == "<= 2 (the local tier's interval)" and lost.met is True
    assert "restored from local 3" in lost.note


def test_a_crash_that_loses_more_than_the_local_interval_is_missed():
    """The negative control: 3 steps lost against an interval of 2."""
    assert rows("local", crash_lost=3)["steps lost, crash (recovery run, two tiers)"].met is False


def test_a_run_before_the_local_tier_keeps_its_rows():
    """Its rows keep their old names; their rule (`recovery`, <= 15 s) gave its headline slot to
    goodput-survive once no such row was on record, so none of issue 50's rules judges them."""
    found = rows(None, crash_lost=1)
    name = "recovery, crash: fault -> first step (recovery run)"
    assert name in found and rules.rule_for(name) is None
