"""A real third-party trainer under tpupod: MaxText from PyPI, unmodified
(examples/jobs/maxtext), on the 2-worker local pod with the real `watch`. It trains a tiny
model on synthetic data, a preemption with notice reaches it mid-run, and the slice comes back:
MaxText must restore its own checkpoint (its log says so), one it saved on the notice (at or
after the step seen when the notice came: no steps lost), go on from the step after it, and
finish.

`slow`: its environment is MaxText's lock (about 240 packages from PyPI, minutes cold). MaxText
needs Python 3.12, which uv cannot download here (GitHub is unreachable): the test hands the
pod this machine's 3.12 (TPUPOD_LOCAL_PYTHON_DIRS) and skips where there is none.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from contract import job as jobs
from demo.observer import Fault, FaultPlan
from demo.reference import pod_provider
from localpod.pod import LocalPod
from ops.fleet.job_status import JobRules
from ops.watch import Limits, WatchConfig, Watcher
from ops.watch.journal import Journal

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3000)]
JOB = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "maxtext"
NOTICE_S = 60.0
RESTORED = re.compile(r"restoring from this run's directory step (\d+)")


def python312() -> str | None:
    """The directory of a Python 3.12 interpreter on this machine (pyenv's, if any)."""
    if pyenv := shutil.which("pyenv"):
        out = subprocess.run([pyenv, "prefix", "3.12"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return str(Path(out.stdout.strip().splitlines()[0]) / "bin")
    found = shutil.which("python3.12")
    return str(Path(found).parent) if found and "/shims/" not in found else None


def test_maxtext_resumes_from_its_own_checkpoint_after_a_preemption(tmp_path, monkeypatch):
    pythons = python312()
    if pythons is None:
        pytest.skip("no Python 3.12 on this machine (MaxText needs it)")
    monkeypatch.setenv("TPUPOD_LOCAL_PYTHON_DIRS", pythons)
    job = jobs.load(JOB)
    pod = LocalPod(tmp_path / "pod", workers=2, job=job)
    try:
        pod.up()
        preempt = Fault("notice", 600, notice=NOTICE_S)
        limits = Limits(hang=job.spec.hang_after_s or 300, start=job.spec.startup_timeout_s or 900,
                        stall=300, bootstrap=1800, ssh=60, preempt_grace=NOTICE_S)  # fmt: skip
        config = WatchConfig(limits=limits, rules=JobRules.of(job.spec), poll=1.0,
                             max_failures=2, ready_deadline=180, backoff_base=0.5)  # fmt: skip
        journal = Journal(tmp_path / "journal.jsonl", Console(stderr=True))
        plan = FaultPlan([preempt], pod)
        code = Watcher(pod_provider(pod.paths.root), journal, config, on_poll=plan).run()
        messages = [f"{e['event']}: {e['message']}" for e in journal.events]
        assert code == 0 and set(plan.injected) == {"preemption"}, messages
        names = [e["event"] for e in journal.events]
        assert names.count("recreated") == 1 and names[-1] == "done", messages
        assert journal.events[-1]["step"] == job.spec.steps, messages
        # MaxText's own words: it restored its own checkpoint and went on from the step after it.
        first = (pod.paths.tpupod_root(0) / "logs" / "job-attempt-2.log").read_text()
        restored = [int(s) for s in RESTORED.findall(first)]
        injected = next(e for e in journal.events if e["event"] == "injected")
        # MaxText saved on the notice (enable_autocheckpoint): at or after the step seen then.
        assert restored and injected["step"] <= restored[0] < job.spec.steps, restored
        resumed = next(e for e in journal.events if e["event"] == "resumed")
        assert resumed["step"] >= restored[0] and resumed["steps_lost"] == 0, messages
        first_step = re.search(r"completed step: (\d+)", first)
        assert first_step and int(first_step.group(1)) == restored[0] + 1, first_step
    finally:
        pod.down()
