"""A code update reaching a running slice (issue 24 item 3): `tpupod local rollout` does what
`pulumi up` does (a new bundle in the bucket, the node's metadata patched through the TPU API's
nodes.patch), the watcher sees the node name a bundle its workers do not run and rolls it out at
a checkpoint boundary (the job saves as for a preemption, every worker's startup script runs
again, the job resumes from that save) without recreating the slice; a preemption after it
recreates the slice from the node as it is now: the workers keep the new bundle."""

from __future__ import annotations

import pytest
from rich.console import Console

from contract import metadata
from demo.observer import Fault, FaultPlan
from demo.reference import pod_provider
from infra import builtin_job
from localpod import rollout
from localpod.pod import LocalPod
from localpod.state import read_json
from ops.fleet.job_status import JobRules
from ops.watch import Limits, WatchConfig, Watcher
from ops.watch.journal import Journal

# slow: a pod, a rollout and a recreate (~3 minutes on 2 cores); CI stays under 20 minutes, and
# the table row it drives (watching --new-bundle--> awaiting-resume) is in tests/ops/test_transitions.py;
# the same pod's CLI path (`tpupod local rollout`, `tpupod rollout`) is in test_localpod_boot.py.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]
STEPS = 120


def test_a_new_bundle_rolls_out_at_a_checkpoint_and_survives_a_recreate(tmp_path, stage):
    job = builtin_job.builtin(f"--config tiny --steps {STEPS} --set checkpoint_every=10")
    pod = LocalPod(tmp_path / "pod", workers=2, job=job)
    published: dict = {}

    class Rollout:
        """At step 30: publish the new bundle, once (what `pulumi up` would do)."""

        def __call__(self, watcher, probes) -> None:
            steps = [s.step for p in probes if (s := p.current(watcher.state.since))]
            if not published and steps and min(steps) >= 30:
                published.update(rollout.publish(pod, job, stage(tmp_path / "tree", "rollout")))

    try:
        pod.up()
        old = read_json(pod.paths.node_spec)["node"]["metadata"][metadata.BUNDLE_SHA256]
        plan = FaultPlan([Fault("kill", 80)], pod)  # a preemption without notice, after it
        roll = Rollout()

        def on_poll(watcher, probes):
            roll(watcher, probes)
            inc = watcher.state.incident
            if published and (inc is None or "resumed" in inc.phases):  # the rollout is over
                plan(watcher, probes)

        limits = Limits(hang=10, start=300, stall=30, bootstrap=600, ssh=60, preempt_grace=30)
        config = WatchConfig(limits=limits, rules=JobRules.of(job.spec), poll=0.5,
                             ready_deadline=180, backoff_base=0.5)  # fmt: skip
        journal = Journal(tmp_path / "journal.jsonl", Console(stderr=True))
        code = Watcher(pod_provider(pod.paths.root), journal, config, on_poll=on_poll).run()
        events = journal.events
        messages = [f"{e['event']}: {e['message']}" for e in events]
        assert code == 0, messages
        assert published["changed"] and published["old"] == old != published["new"]
        new = published["new"]
        names = [e["event"] for e in events]
        # Rolled out on the running slice (no recreate for it), then one recreate for the kill.
        assert names.count("rolled_out") == 1 and names.count("recreated") == 1, messages
        assert names.index("rolled_out") < names.index("recreated"), messages
        resumed = {e["kind"]: e for e in events if e["event"] == "resumed"}
        assert set(resumed) == {"rollout", "preemption"}, messages
        assert resumed["rollout"]["steps_lost"] == 0, messages  # saved at the stop
        moves = [(e["phase"], e["on"], e["to"]) for e in events if e["event"] == "transition"]
        assert ("watching", "new-bundle", "awaiting-resume") in moves, moves
        # Every worker runs the new bundle after the recreate too.
        for i in range(2):
            boot = read_json(pod.paths.root / "workers" / str(i) / "tpupod" / "bootstrap.json")
            assert boot["bundle_sha256"] == new, boot
        assert events[-1]["event"] == "done" and events[-1]["step"] == STEPS
    finally:
        pod.down()
