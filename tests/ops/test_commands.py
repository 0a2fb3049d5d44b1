"""The `tpupod` commands' one-line errors, the journal, and an interruptible watch loop."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import pytest

from contract.status import JobStatus, parse_status
from ops.cli import build_parser, main
from ops.cloud.target import PULUMI_MISSING, SshSettings, Target, load_target
from ops.cloud.tpu import TpuProvider
from ops.fleet.probe import Probe
from ops.json_file import write_atomic
from ops.watch import WatchConfig, Watcher
from ops.watch.journal import Journal, read
from tests.ops.conftest import dummy_token


def test_every_command_is_registered_once():
    names = set(build_parser()._subparsers._group_actions[0].choices)
    assert {"status", "logs", "restart", "watch", "demo", "local"} <= names


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """Cached stack outputs and incidents go to a tmp dir, never the repo's .tpupod/."""
    monkeypatch.setenv("TPUPOD_STATE_DIR", str(tmp_path / "state"))


@pytest.mark.parametrize("command", ["status", "logs", "restart", "watch"])
def test_unknown_stack_is_one_line_naming_the_stacks(command, capsys):
    assert main([command, "--stack", "v9-9999"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown stack 'v9-9999'" in err and "v4-32" in err
    assert "pulumi stack init v9-9999" in err


@pytest.mark.parametrize("command", ["status", "watch"])
def test_gcp_stack_without_pulumi_says_what_to_install(command, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main([command, "--stack", "v4-32"]) == 2
    assert capsys.readouterr().err.strip() == f"tpupod: {PULUMI_MISSING}"


def test_spec_file_errors_and_missing_credentials_are_one_line(capsys, monkeypatch, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text('{"node_id": "n"}')
    assert main(["status", "--stack", "v4-32", "--spec", str(spec)]) == 2
    assert "needs `parent`, `node_id` and `node`" in capsys.readouterr().err
    spec.write_text(json.dumps({"parent": "projects/p/locations/z", "node_id": "n", "node": {}}))
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    # No metadata server here: do not ask 169.254.169.254 for one. google-auth reads NO_GCE_CHECK
    # (lowercase "true") once, at import, so the variable alone would come too late.
    from google.auth.compute_engine import _metadata

    monkeypatch.setattr(_metadata, "_NO_GCE_CHECK", True)
    monkeypatch.setenv("HOME", str(tmp_path))  # no gcloud application-default credentials
    assert main(["status", "--stack", "v4-32", "--spec", str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tpupod: no Google credentials: run `gcloud auth application-default")
    assert "\n" not in err


def test_local_stack_without_a_pod_says_what_to_run(capsys, tmp_path):
    assert main(["watch", "--stack", "local", "--pod-dir", str(tmp_path)]) == 2
    assert "tpupod local up" in capsys.readouterr().err


def test_journal_is_json_lines_with_wall_time(tmp_path):
    journal = Journal(tmp_path / "j" / "events.jsonl")
    journal.event("detected", "preemption", kind="preemption", step=12)
    journal.event("resumed", "at 12", step=12, steps_lost=0)
    (tmp_path / "j" / "events.jsonl").open("a").write('{"torn')  # a crash mid-write
    events = read(tmp_path / "j" / "events.jsonl")
    assert [e["event"] for e in events] == ["detected", "resumed"]
    assert events[0]["time"] <= events[1]["time"] and events[1]["steps_lost"] == 0


def test_watch_is_interruptible_and_leaks_no_threads(tmp_path):
    """Ctrl-C inside a TPU API call (a server that never answers): the loop journals it, keeps
    the incident file and re-raises (exit 130 in `ops.cli.main`)."""
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    spec = {"parent": "projects/p/locations/z", "node_id": "n", "node": {}}
    target = Target("s", "p", "z", "n", spec, SshSettings(None, None),
                    api_endpoint=f"http://127.0.0.1:{port}", token_file=dummy_token())  # fmt: skip
    journal = Journal(tmp_path / "j.jsonl")
    watcher = Watcher(TpuProvider(target), journal, WatchConfig())
    before = threading.active_count()

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            watcher.run()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        silent.close()
    assert [e["event"] for e in journal.events] == ["watching", "interrupted"]
    assert watcher.group is None and threading.active_count() <= before


def test_stack_outputs_cached_beside_the_journal_need_no_pulumi(capsys, monkeypatch, tmp_path):
    spec = {"parent": "projects/p/locations/z", "node_id": "tpupod-v4-32", "node": {}}
    write_atomic(tmp_path / "state" / "v4-32" / "target.json", {"node_spec": spec})
    monkeypatch.setenv("PATH", "/nonexistent")  # no pulumi, no gcloud
    target = load_target("v4-32")
    assert (target.project, target.zone, target.node) == ("p", "z", "tpupod-v4-32")
    assert target.ssh.via == "iap" and target.api_endpoint is None and target.token_file is None
    assert target.ssh.iap_command.startswith("gcloud compute start-iap-tunnel {instance} 22")


def test_watch_journals_a_checkpoint_fallback_once_per_trainer(tmp_path):
    """A trainer that restored past an unreadable step lists it in status.json's `fallbacks`
    (trainer/train.py); watch journals it once per trainer process, not at every poll, and
    reads the typed field, not the message a person reads."""
    spec = {"parent": "projects/p/locations/z", "node_id": "n", "node": {}}
    target = Target("s", "p", "z", "n", spec, SshSettings(None, None),
                    api_endpoint="http://127.0.0.1:9", token_file=dummy_token())  # fmt: skip
    journal = Journal(tmp_path / "j.jsonl")
    watcher = Watcher(TpuProvider(target), journal, WatchConfig())
    line = "checkpoint step 12 unreadable (...): restored step 8"
    raw = {"step": 9, "pid": 41, "restored_from": 8, "message": "restored past a bad step",
           "fallbacks": [{"step": 12, "restored": 8, "line": line}], "time": time.time()}  # fmt: skip
    status = parse_status(json.dumps(raw))
    worded = JobStatus(step=9, pid=43, message=f"checkpoint_fallback: {line}", updated=time.time())
    plain = JobStatus(step=9, pid=42, updated=time.time())
    for _ in range(3):
        watcher.progress.track([Probe(0, status=status), Probe(1, status=plain),
                                Probe(2, status=worded)])  # fmt: skip
    events = [e for e in journal.events if e["event"] == "checkpoint_fallback"]
    assert len(events) == 1  # once, and not for a message that merely reads like one
    assert events[0]["worker"] == 0 and events[0]["restored"] == 8 and line in events[0]["message"]
    assert events[0]["set_aside"] == [12]


@pytest.mark.parametrize("tier", ["bucket", "local"])
def test_only_a_crash_loop_waits_before_its_restart(tmp_path, tier):
    """The first failure restart goes at once; another before a newer checkpoint doubles the
    wait; a newer committed step ends the streak: in the bucket, or in the local tier, which a
    restart on the same VMs restores (the recovery bench's hang, 30 steps after a crash, waited
    a second for a bucket commit it had no time to make). The same step again keeps doubling."""
    spec = {"parent": "projects/p/locations/z", "node_id": "n", "node": {}}
    target = Target("s", "p", "z", "n", spec, SshSettings(None, None),
                    api_endpoint="http://127.0.0.1:9", token_file=dummy_token())  # fmt: skip
    journal = Journal(tmp_path / "j.jsonl")
    watcher = Watcher(TpuProvider(target), journal, WatchConfig(max_failures=10))
    watcher.state.since = 0.0

    def commits(step):
        steps = {"last_checkpoint": step} if tier == "bucket" else {
            "last_checkpoint": 100, "local_checkpoint": step}  # fmt: skip
        status = JobStatus(step=step + 3, pid=7, updated=time.time(), **steps)
        watcher.progress.track([Probe(0, status=status)])

    commits(120)
    waits = []
    for _ in range(3):
        watcher.charge("crash")
        waits.append(watcher.restart_wait())
        commits(120)  # restored, but nothing newer committed
    assert waits == [0.0, 2.0, 4.0]
    commits(200)
    watcher.charge("hang")
    assert watcher.restart_wait() == 0.0 and watcher.state.failures == 4
    assert parse_status('{"step": 5, "local_checkpoint": 4}').local_checkpoint == 4


@pytest.mark.parametrize(("kind", "failure", "stop"),
                         [("hang", True, 0), ("crash", True, 1), ("preemption", False, None)])  # fmt: skip
def test_a_hung_job_is_killed_at_once_a_crashed_one_after_a_second(tmp_path, kind, failure, stop):
    """The stop's SIGTERM -> SIGKILL time per cause: a hung job never acts on SIGTERM (its
    stacks are kept first), a crash's survivors exit within a second of it, a preempted job
    restarted on its surviving VMs gets its own grace (None: jobctl reads grace_s)."""
    from ops.watch import actions
    from ops.watch.incident import Incident

    spec = {"parent": "projects/p/locations/z", "node_id": "n", "node": {}}
    target = Target("s", "p", "z", "n", spec, SshSettings(None, None),
                    api_endpoint="http://127.0.0.1:9", token_file=dummy_token())  # fmt: skip
    watcher = Watcher(TpuProvider(target), Journal(tmp_path / "j.jsonl"), WatchConfig())
    calls = []

    class Group:
        def jobctl(self, verb, timeout=None, stop_timeout=None, attempt=None, keep_standby=False):
            calls.append((verb, stop_timeout, keep_standby))
            return {}  # every worker's outcome, as WorkerGroup.jobctl returns them

    watcher.workers = lambda which=None: Group()
    inc = Incident(kind, "test", time.time(), 10, phase_since=time.time())
    actions.restart(watcher, inc, kind, failure=failure)
    assert calls == [("stop clear-locks", stop, True), ("start", None, False)]


def test_status_says_a_recreate_came_back_where_a_request_was_filed_beside_another():
    """The queue keeps its place (issue 48): a request filed beside a waiting one in another
    zone may be the one filled; `tpupod status` says why the slice moved, and says nothing
    when the waiting one won."""
    from ops.watch.remote_watch import restarts_of

    def journal(winner: str) -> list[dict]:
        return [{"event": "detected", "message": "preemption: slice PREEMPTED", "time": 0},
                {"event": "beside", "zone": "a", "next_zone": "b", "time": 1},
                {"event": "recreated", "zone": winner, "attempt": 2, "time": 2}]  # fmt: skip

    assert restarts_of(journal("b"), None)[1].endswith(
        "recreated slice in b, after waiting in a): preemption: slice PREEMPTED"
    )
    assert "after" not in restarts_of(journal("a"), None)[1]


def test_a_compute_engine_spec_gets_the_compute_provider(capsys, tmp_path):
    """A Compute Engine stack's spec (tpupod:api: compute, exported by the Pulumi program) is read
    as its group, in its zone, by ComputeProvider (issue 51); a spec missing the group is one
    line naming what it lacks."""
    from infra import offline
    from ops.cloud.compute import ComputeProvider
    from ops.cloud.providers import provider_for
    from ops.cloud.target import load_target

    spec = offline.evaluate("tpu7x-16").values["node_spec"]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    target = load_target("tpu7x-16", spec_file=path, cache_dir=tmp_path)
    assert (target.api, target.node, target.zone) == ("compute", "tpupod-tpu7x-16",
                                                      "us-central1-c")  # fmt: skip
    assert target.metadata["tpupod-stack"] == "tpu7x-16"  # the template's metadata
    provider = provider_for(target)
    assert isinstance(provider, ComputeProvider) and not provider.queued
    assert provider.zones[0] == "us-central1-c"
    del spec["manager"]
    path.write_text(json.dumps(spec))
    assert main(["status", "--stack", "tpu7x-16", "--spec", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "a Compute Engine slice spec needs" in err and "missing: manager" in err
    assert "\n" not in err
