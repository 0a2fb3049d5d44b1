"""`watch` on the local pod through its TPU API, with the real bootstrap and launcher: a job that
always crashes spends its `max_restarts` budget and recovery stops (exit 3, one `gave_up`).

Recovery that ends well is tests/e2e/test_jobs.py (examples: crash, preemption with and without
notice, bitwise), test_job_contract.py (hold, fatal exit, attempts) and test_demo.py (hang).
"""

from __future__ import annotations

import pytest
from rich.console import Console

from contract import job as jobs
from demo.reference import pod_provider
from localpod.pod import LocalPod
from ops.fleet.job_status import JobRules
from ops.watch import EXIT_GAVE_UP, Limits, WatchConfig, Watcher
from ops.watch.journal import Journal

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_job_that_always_crashes_spends_its_budget_and_stops(tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "tpupod-job.yaml").write_text(
        "run: echo 'failing on purpose'; exit 1\nprogress: none\nmax_restarts: 2\n"
    )
    job = jobs.load(job_dir)
    pod = LocalPod(tmp_path / "pod", workers=2, job=job)
    try:
        pod.up()
        limits = Limits(hang=10, start=60, stall=30, bootstrap=300, ssh=60, preempt_grace=30)
        config = WatchConfig(limits=limits, rules=JobRules.of(job.spec), poll=0.5,
                             max_failures=job.spec.max_restarts, backoff_base=0.5)  # fmt: skip
        journal = Journal(tmp_path / "journal.jsonl", Console(stderr=True))
        code = Watcher(pod_provider(pod.paths.root), journal, config).run()
    finally:
        pod.down()
    events = journal.events
    assert code == EXIT_GAVE_UP, [e["message"] for e in events]
    gave_up = [e for e in events if e["event"] == "gave_up"]
    assert len(gave_up) == 1
    assert "giving up after 2 failure restarts" in gave_up[0]["message"]
    assert "exited 1" in gave_up[0]["message"]
    # two restarts (a job that dies at once may also fail `jobctl start` itself)
    attempts = [e for e in events if e["event"] == "restarted" or "restart failed" in e["message"]]
    assert len(attempts) == 2
