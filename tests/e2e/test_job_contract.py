"""The job contract end to end on a 2-worker local pod, with a job that reports what it is given
(tests/e2e/jobs/contract: its own `python: uv` environment, a secret, env, status-file progress,
exit 0 on SIGTERM, exit 2 from its fourth attempt on) and the real `watch` running beside:

1. every variable of the contract, as the job sees it, and its own environment and secret;
2. `tpupod stop` holds: the watcher, running, undoes nothing; `tpupod start` is attempt 2;
3. a preemption without notice, during whose recovery the watcher meets a bug of its own (the
   create raises) and dies; a new watcher goes on from the state in the bucket, recreating the
   slice once, as attempt 3; attempt 2's output, whose VM is gone, is read from the bucket
   (`tpupod logs --attempt 2`);
4. a crash: attempt 4 exits 2 (`exit_codes.fatal`): recovery stops at once, one line in
   `tpupod status`, watch exits 3;
5. the secret's value is in no metadata, bundle, environment file or log.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from rich.console import Console

from contract import job as jobs
from demo.reference import pod_provider
from infra.bundle_archive import build_bundle
from localpod.pod import LocalPod
from ops.cli import main
from ops.cloud.target import local_target
from ops.cloud.tpu import TpuProvider
from ops.fleet.job_status import JobRules
from ops.watch import EXIT_GAVE_UP, Limits, WatchConfig, Watcher
from ops.watch.journal import Journal
from ops.watch.remote_state import RemoteState

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]
CONTRACT = Path(__file__).parent / "jobs" / "contract"


class Stop(Exception):
    """Ends a watcher thread the test no longer needs."""


def status(pod: LocalPod, worker: int) -> dict:
    try:
        return json.loads((pod.paths.tpupod_root(worker) / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def wait(what: str, check, timeout: float = 120.0):
    deadline = time.time() + timeout
    while not (found := check()):
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
    return found


def progressing(pod: LocalPod, attempt: int) -> bool:
    return all(status(pod, i).get("attempt") == attempt and status(pod, i)["step"] >= 3
               for i in range(2))  # fmt: skip


def contract_lines(text: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("contract ")]  # fmt: skip


def test_the_job_contract_end_to_end(tmp_path, capsys, monkeypatch):
    job = jobs.load(CONTRACT)
    pod = LocalPod(tmp_path / "pod", workers=2, job=job)
    secret = f"s3cr3t-{secrets.token_hex(8)}"
    pod.set_secret("PROBE_TOKEN", secret.encode())  # as on GCP: the secret exists first
    stop = threading.Event()
    outcome: list = []
    try:
        pod.up()
        state = RemoteState.for_target(local_target(pod.paths.root))
        journal = Journal(tmp_path / "journal.jsonl", Console(stderr=True), sink=state.append)
        limits = Limits(hang=10, start=120, stall=30, bootstrap=300, ssh=60, preempt_grace=3)
        config = WatchConfig(limits=limits, rules=JobRules.of(job.spec), poll=0.5,
                             max_failures=3, ready_deadline=120, backoff_base=0.5)  # fmt: skip

        def watch() -> threading.Thread:
            """A watcher on the bucket's state, in a thread of its own, as the service runs it."""
            watcher = Watcher(pod_provider(pod.paths.root), journal, config, store=state,
                              hold=state.read_hold)  # fmt: skip
            watcher.guard = lambda: _stop_if(stop)
            thread = threading.Thread(target=lambda: outcome.append(_run(watcher)), daemon=True)
            thread.start()
            return thread

        thread = watch()
        cli = ["--stack", "local", "--pod-dir", str(pod.paths.root)]

        # 1. The contract, as the job sees it.
        wait("attempt 1 progressing", lambda: progressing(pod, 1))
        endpoints = pod.endpoints()
        coordinator = pod.describe().workers[0].host
        for i in range(2):
            log = (pod.paths.tpupod_root(i) / "logs" / "job-attempt-1.log").read_text()
            (seen,) = contract_lines(log)
            run_dir = f"gs://{pod.bucket}/runs/local/{pod.run_id}"
            assert seen["TPUPOD_RUN_ID"] == pod.run_id and seen["TPUPOD_ATTEMPT"] == "1"
            assert (seen["TPUPOD_PROCESS_ID"], seen["TPUPOD_NUM_PROCESSES"]) == (str(i), "2")
            assert seen["JAX_COORDINATOR_ADDRESS"].startswith(f"{coordinator}:")
            assert seen["TPUPOD_CHECKPOINT_DIR"] == f"{run_dir}/checkpoints"
            assert seen["TPUPOD_STATUS_FILE"] == str(pod.paths.tpupod_root(i) / "status.json")
            assert seen["TPUPOD_GRACE_S"] == "10"
            assert seen["TPUPOD_MAX_LOSS_S"] == "90"  # max_loss_minutes: 1.5
            assert seen["TPUPOD_COMPILE_CACHE"] == f"gs://{pod.bucket}/compile-cache/local"
            own = f"http://{pod.describe().workers[i].host}:{pod.describe().pod['emulator_port']}"
            assert seen["STORAGE_EMULATOR_HOST"] == own != endpoints["storage"]  # the VM's URL
            assert seen["TENSORSTORE_GCS_HTTP_URL"] == own
            assert seen["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false"
            assert seen["GREETING"] == "hello world"  # the job's own env
            assert seen["six"] == "1.16.0" and "/envs/uv-" in seen["prefix"]  # its own venv
            assert seen["python"].startswith(seen["prefix"])  # `python` is that venv's
            assert seen["secret_sha256"] == hashlib.sha256(secret.encode()).hexdigest()

        # 2. `tpupod stop` holds while the watcher runs; `tpupod start` is the next attempt.
        assert main(["stop", *cli, "--reason", "test"]) == 0
        root = pod.paths.tpupod_root(0)
        wait("the job stopped", lambda: (root / "job.exit").exists())
        assert (root / "job.exit").read_text().strip() == "0" and (root / "job.term").exists()
        time.sleep(limits.preempt_grace + 4)  # exit 0 after SIGTERM: a preemption to resume...
        names = [e["event"] for e in journal.events]
        assert "held" in names and "restarted" not in names, names  # ...but held: no action
        assert not (root / "job.pid").exists() or not progressing(pod, 1)
        capsys.readouterr()
        assert main(["start", *cli]) == 0
        assert "attempt 2" in capsys.readouterr().out
        wait("attempt 2 progressing", lambda: progressing(pod, 2))

        # 3. A preemption without notice: attempt 3 on a new slice; attempt 2's output from
        # the bucket (its VM is gone).
        time.sleep(3)  # attempt 2's first upload (jobrun.FIRST_UPLOAD_S)
        monkeypatch.setattr(TpuProvider, "start_create", _raises_once(TpuProvider.start_create))
        pod.preempt(0, wait=False)
        thread.join(timeout=180)  # the bug ends the watch as an exception ends the process (exit 1)
        assert [str(o) for o in outcome] == ["a bug in the watcher"], outcome
        outcome.clear()
        thread = watch()  # what systemd does after exit 1: the new watcher continues the incident
        wait("attempt 3 progressing", lambda: progressing(pod, 3), timeout=180)
        continuing = [e for e in journal.events if e["event"] == "continuing"]
        assert len(continuing) == 1 and continuing[0]["kind"] == "preemption", continuing
        capsys.readouterr()
        assert main(["logs", *cli, "--attempt", "2", "-n", "0"]) == 0
        out = capsys.readouterr().out
        for i in range(2):
            lines = [
                line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(f"[w{i}]")
            ]
            (seen,) = contract_lines("\n".join(lines))
            assert seen["TPUPOD_ATTEMPT"] == "2" and seen["TPUPOD_PROCESS_ID"] == str(i)
        assert any("job restarted" in e["message"] and e.get("attempt") == 2
                   for e in journal.events) is False  # attempt 2 was `tpupod start`'s  # fmt: skip
        assert [e["attempt"] for e in journal.events if e["event"] == "recreated"] == [3]

        # 4. A crash; the next attempt exits 2, a fatal code: recovery stops at once.
        wait("the preemption resumed", lambda: any(
            e["event"] == "resumed" and e["kind"] == "preemption" for e in journal.events))  # fmt: skip
        pod.crash(1)
        thread.join(timeout=120)
        assert outcome == [EXIT_GAVE_UP], [e["message"] for e in journal.events]
        gave_up = [e for e in journal.events if e["event"] == "gave_up"]
        assert len(gave_up) == 1 and "exited 2" in gave_up[0]["message"], gave_up
        assert "exit_codes.fatal" in gave_up[0]["message"]
        # One restart, not retried: attempt 4 ran on every worker and no attempt 5 did. (Its
        # start may already see it exit 2, on a fast machine: `restart failed`, then the stop.)
        for i in range(2):
            logs = sorted(p.name for p in (pod.paths.tpupod_root(i) / "logs").glob("job-attempt-*"))
            assert "job-attempt-4.log" in logs and "job-attempt-5.log" not in logs, logs
        detected = [e["kind"] for e in journal.events if e["event"] == "detected"]
        assert detected == ["preemption", "crash"], detected  # the stop was none
        capsys.readouterr()
        assert main(["status", *cli]) == 0
        shown = capsys.readouterr().out
        assert "recovery stopped: the job exited fatally" in shown, shown
        assert f"run {pod.run_id}, attempt 4" in shown and "(exit 2)" in shown, shown

        # 5. The secret's value: nowhere but in the job's process environment.
        places = {
            "node spec": pod.paths.node_spec.read_bytes(),
            "bundle": build_bundle(job=job).data,
            "bucket": b"".join(
                state.bucket.blob(b.name).download_as_bytes() for b in state.bucket.list_blobs()
            ),  # fmt: skip
        }
        for i in range(2):
            r = pod.paths.tpupod_root(i)
            for path in [r / "job.env", r / "job.json", r / "job.log", r / "bootstrap.log",
                         *sorted((r / "logs").glob("*"))]:  # fmt: skip
                places[str(path)] = path.read_bytes()
        leaked = [where for where, data in places.items() if secret.encode() in data]
        assert leaked == [], leaked
        assert secret.encode() not in (tmp_path / "journal.jsonl").read_bytes()

        # 6. `tpupod local storage-faults`: the bucket's fault plan set, shown, refused if bad.
        faults = ["local", "storage-faults", "--pod-dir", str(pod.paths.root)]
        capsys.readouterr()
        assert main([*faults, "--rate", "1", "--kinds", "503"]) == 0
        assert "100.0% of requests fail as 503" in capsys.readouterr().out
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(f"{endpoints['storage']}/storage/v1/b", timeout=10)
        assert main(faults) == 0
        assert "503 1," in capsys.readouterr().out
        assert main([*faults, "--rate", "2"]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
        assert main([*faults, "--rate", "0"]) == 0
    finally:
        stop.set()
        pod.down()


def _run(watcher: Watcher) -> int | str | Exception:
    try:
        return watcher.run()
    except Stop:
        return "stopped"
    except RuntimeError as err:  # an internal error: the process would exit 1
        return err


def _stop_if(stop: threading.Event) -> None:
    if stop.is_set():
        raise Stop


def _raises_once(method):
    """The real method, but the first call raises: a bug inside a recovery step."""
    calls = []

    def call(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the watcher")
        return method(self, *args, **kwargs)

    return call
