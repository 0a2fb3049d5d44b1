"""Users' programs under tpupod: each example job (examples/jobs) runs on a 2-worker local pod
through a crash and a preemption, recovered by the real `watch`, and its final committed
checkpoint equals, array by array and bitwise, the same job's run without faults
(ops.commands.checkpoint_compare, generic: no knowledge of any job's tree).

- flax-plain (no helper) meets a preemption with notice and exits 0 once its save is committed
  (as MaxText and Orbax's guide do): a preemption, not done.
- flax-helper (tpupod_job) meets a preemption without notice: a kill, back to its last save; its
  crash resumes from its local tier (tpupod_job.open_local_tier).
- flax-plain again on the Compute Engine path: the slice a managed instance group, recreated by
  the same watcher through the pod's Compute Engine API.
- wrong-resume resumes at its latest step instead of the one after it: the comparison must say
  NOT equal (the negative control: a comparison that cannot fail proves nothing). On the pod
  it is `slow`; CI runs the same program and comparison without a pod
  (tests/ops/test_checkpoint_compare.py).
The built-in trainer's job goes through a hang, a crash and a preemption in test_demo.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from contract import job as jobs
from demo.observer import Fault, FaultPlan
from demo.reference import compare_runs, pod_provider, run_reference
from localpod.pod import LocalPod
from ops.commands.checkpoint_compare import Comparison
from ops.fleet.job_status import JobRules
from ops.watch import Limits, WatchConfig, Watcher
from ops.watch.journal import Journal

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"
NOTICE_S = 10.0  # GCE gives spot VMs 30 s; the job saves in about one, and CI waits less


def config(job: jobs.Job, max_failures: int = 3) -> WatchConfig:
    limits = Limits(hang=10, start=300, stall=30, bootstrap=600, ssh=60, preempt_grace=30)
    return WatchConfig(limits=limits, rules=JobRules.of(job.spec), poll=0.5,
                       max_failures=max_failures, ready_deadline=180, backoff_base=0.5)  # fmt: skip


def run_with_faults(pod: LocalPod, faults: list[Fault], journal: Path) -> tuple[int, list[dict]]:
    watch = Journal(journal, Console(stderr=True))
    plan = FaultPlan(faults, pod)
    code = Watcher(pod_provider(pod.paths.root), watch, config(pod.job), on_poll=plan).run()
    assert set(plan.injected) == {f.incident for f in faults}, [e["message"] for e in watch.events]
    return code, watch.events


def against_reference(pod: LocalPod) -> Comparison:
    ok, _ = run_reference(pod.paths.root, "reference")
    assert ok, "the uninterrupted run failed"
    run = f"gs://{pod.bucket}/{pod.run_prefix}"
    reference = f"{run.rsplit('/', 1)[0]}/reference"
    comparison = compare_runs(pod.paths.root, f"{run}/checkpoints", f"{reference}/checkpoints")
    assert comparison is not None
    print("\n".join(comparison.lines()))
    return comparison


# All `slow` (3 minutes each; CI stays under 20 minutes): in CI the job contract test recovers a
# user job from a preemption without notice on the TPU API path, and tests/localpod/
# test_compute_api.py drives the Compute Engine path's provider (describe, recreate, a stockout's
# zone move, destroy's hook) against the local Compute Engine API with gcloud and Google's client.
# The Compute Engine path (a managed instance group: issue 51) heals the same job the same way.
@pytest.mark.parametrize(("name", "notice", "api"), [
    pytest.param("flax-plain", NOTICE_S, "compute", marks=pytest.mark.slow),
    pytest.param("flax-plain", NOTICE_S, "tpu", marks=pytest.mark.slow),
    pytest.param("flax-helper", 0.0, "tpu", marks=pytest.mark.slow)])  # fmt: skip
def test_a_job_resumes_bitwise_after_a_crash_and_a_preemption(name, notice, api, tmp_path):
    job = jobs.load(EXAMPLES / name)
    steps = job.spec.steps
    pod = LocalPod(tmp_path / "pod", workers=2, job=job, api=api)
    try:
        pod.up()
        pod.package_index(reachable=False)  # as in a VPC without NAT: the recreate has the bucket
        faults = [
            Fault("crash", int(steps * 0.3), worker=1),
            Fault("notice" if notice else "kill", int(steps * 0.6), notice=notice),
        ]
        code, events = run_with_faults(pod, faults, tmp_path / "journal.jsonl")
        messages = [f"{e['event']}: {e['message']}" for e in events]
        assert code == 0, messages
        resumed = {e["kind"]: e for e in events if e["event"] == "resumed"}
        assert set(resumed) == {"crash", "preemption"}, messages
        names = [e["event"] for e in events]
        # One `done`, at the end, at the job's steps: an exit after the notice was not taken
        # for it (flax-plain exits 0 when preempted).
        assert names.count("done") == 1 and names[-1] == "done", messages
        assert events[-1]["step"] == steps
        assert names.count("recreated") == 1 and names.count("restarted") == 1, messages
        attempts = [e["attempt"] for e in events if e["event"] in ("restarted", "recreated")]
        assert attempts == [2, 3], messages
        if notice:  # saved inside the notice: nothing lost
            assert resumed["preemption"]["steps_lost"] == 0, messages
        if name == "flax-helper":  # its local tier (tpupod_job.open_local_tier): a crash reads
            # the worker's own disk, a recreate (empty disks) the bucket
            assert resumed["crash"]["tier"] == "local", messages
            assert resumed["preemption"]["tier"] == "persistent", messages
        comparison = against_reference(pod)
        assert comparison.equal and comparison.step_a == steps and comparison.leaves >= 10
        assert_installed_from_the_bucket_alone(pod)
    finally:
        pod.down()


def assert_installed_from_the_bucket_alone(pod: LocalPod) -> None:
    """The recreated workers' uv and environment came from the bucket, and they could not have
    come from anywhere else: the same pip, in a worker's environment, reaches no index."""
    for i in range(pod.workers):
        log = (pod.paths.tpupod_root(i) / "bootstrap.log").read_text()
        assert "[uv] environment uv-" in log and "[sync] environment" in log, log[-3000:]
        restored = [line for line in log.splitlines() if "restored from gs://" in line]
        assert [line.split(" [", 1)[1][:4] for line in restored] == ["uv] ", "sync"], restored
        assert "package index" not in log and "published" not in log, log[-3000:]
    env = json.loads(pod.paths.agent_config(0).read_text())["env"]
    pip = subprocess.run(
        ["python3", "-m", "pip", "download", "--no-deps", "--dest", str(pod.paths.root / "dl"),
         "six==1.16.0"],
        env={**env, "PIP_RETRIES": "0", "PIP_TIMEOUT": "5", "PIP_CONFIG_FILE": "/dev/null"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert pip.returncode != 0 and not list((pod.paths.root / "dl").glob("six*")), pip.stdout


@pytest.mark.slow
def test_a_wrong_resume_is_reported_not_equal(tmp_path):
    job = jobs.load(EXAMPLES / "wrong-resume")
    pod = LocalPod(tmp_path / "pod", workers=2, job=job)
    try:
        pod.up()
        crash = Fault("crash", 35, worker=0)
        code, events = run_with_faults(pod, [crash], tmp_path / "journal.jsonl")
        assert code == 0, [e["message"] for e in events]
        comparison = against_reference(pod)
        assert comparison.step_a == comparison.step_b == job.spec.steps
        assert not comparison.equal and comparison.differ
        assert any(d.startswith("default/params/") for d in comparison.differ), comparison.differ
        assert "NOT equal" in comparison.lines()[0]
    finally:
        pod.down()
