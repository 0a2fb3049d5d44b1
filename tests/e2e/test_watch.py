"""`watch` on the local pod through its TPU API: real bootstrap, real trainer, real SSH, signals.

The preemption-with-notice (whose first recreate meets a stockout), hang and bitwise-equal-weights
scenario is `tpupod demo` (tests/e2e/test_demo.py); here: a preemption with no notice, a crash,
and the failure budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from localpod.pod import LocalPod
from ops.demo import pod_provider
from ops.demo_observer import Fault, FaultPlan
from ops.journal import Journal
from ops.recovery import Limits
from ops.watch import WatchConfig, Watcher

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def config(max_failures: int = 3) -> WatchConfig:
    limits = Limits(hang=10, start=300, stall=400, bootstrap=600, ssh=60, preempt_grace=30)
    return WatchConfig(limits=limits, poll=0.5, max_failures=max_failures, ready_deadline=180,
                       backoff_base=0.5)  # fmt: skip


@pytest.fixture
def make_pod(tmp_path: Path) -> Iterator:
    """A 2-worker pod booting the real bootstrap/startup.sh; always downed."""
    pods: list[LocalPod] = []

    def make(trainer_args: str) -> LocalPod:
        pod = LocalPod(tmp_path / f"pod{len(pods)}", workers=2, trainer_args=trainer_args)
        pods.append(pod)
        pod.up()
        return pod

    try:
        yield make
    finally:
        for pod in pods:
            pod.down()


def watch(pod: LocalPod, cfg: WatchConfig, faults: list[Fault], path: Path):
    journal = Journal(path, Console(stderr=True))
    plan = FaultPlan(faults, pod)
    code = Watcher(pod_provider(pod.paths.root), journal, cfg, on_poll=plan).run()
    return code, journal.events, plan.injected


def test_no_notice_preemption_and_a_crash_are_recovered(make_pod, tmp_path):
    steps = 40
    pod = make_pod(f"--config tiny --steps {steps} --set checkpoint_every=10")
    faults = [
        Fault("preemption", 12, lambda p: p.preempt(0, wait=False), "preemption, no notice"),
        Fault("crash", 25, lambda p: p.crash(1), "crash (SIGKILL) of worker 1"),
    ]
    code, events, injected = watch(pod, config(), faults, tmp_path / "journal.jsonl")
    assert code == 0, [e["message"] for e in events]
    assert set(injected) == {"preemption", "crash"}
    detected = {e["kind"]: e for e in events if e["event"] == "detected"}
    resumed = {e["kind"]: e for e in events if e["event"] == "resumed"}
    assert set(detected) == set(resumed) == {"preemption", "crash"}
    # the slice was recreated and bootstrapped again for the preemption, not for the crash
    names = [e["event"] for e in events]
    assert names.count("recreated") == names.count("bootstrapped") == 1
    assert names.count("restarted") == 1
    for kind, event in resumed.items():
        # no notice: the steps since the last committed checkpoint are lost (and only those)
        assert event["step"] % 10 == 0 and event["steps_lost"] >= 0, (kind, event)
        assert event["step"] + event["steps_lost"] >= injected_step(events, kind), (kind, event)
        print(f"{kind}: detected {detected[kind]['time'] - injected[kind]:.2f}s after injection")
    done = next(e for e in events if e["event"] == "done")
    assert done["step"] == steps and done["preemptions"] == 1 and done["failures"] == 1


def injected_step(events, kind):
    return next(e["step"] for e in events if e["event"] == "injected" and e["kind"] == kind)


def test_a_trainer_that_always_fails_spends_the_budget_and_stops(make_pod, tmp_path):
    # Bad input: the trainer exits 2 at once, every time it is started.
    pod = make_pod("--config tiny --steps 20 --set no_such_field=1")
    code, events, _ = watch(pod, config(max_failures=2), [], tmp_path / "journal.jsonl")
    assert code == 1
    gave_up = [e for e in events if e["event"] == "gave_up"]
    assert len(gave_up) == 1
    assert "giving up after 2 failure restarts" in gave_up[0]["message"]
    assert "exited 2" in gave_up[0]["message"]
    # two restarts (a trainer that dies at once may also fail `trainerctl start` itself)
    attempts = [e for e in events if e["event"] == "restarted" or "restart failed" in e["message"]]
    assert len(attempts) == 2
