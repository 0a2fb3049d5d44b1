"""The one provider against the local pod's Cloud TPU API: describe, SSH like gcloud (IAP
stand-in, pinned host keys), sudo, and recovery steps through the table, persisted across a
restart of watch. The pod boots the stand-in startup script (conftest): seconds per create."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest
from google.api_core.exceptions import NotFound

from demo.reference import pod_provider
from localpod.pod import LocalPod
from ops.cloud.slice import SliceState
from ops.fleet.workers import WorkerError, WorkerGroup, as_root
from ops.watch import Limits, WatchConfig, Watcher
from ops.watch.incident import IncidentStore
from ops.watch.journal import Journal
from ops.watch.transitions import Phase

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
CONFIG = WatchConfig(limits=Limits(bootstrap=60), poll=0.2, ready_deadline=60,
                     operation_deadline=60, backoff_base=0.2, capacity_backoff=0.2)  # fmt: skip


def drive(watcher: Watcher, until, timeout: float = 60.0) -> None:
    """Polls the watcher (without its loop) until `until(watcher)`."""
    deadline = time.monotonic() + timeout
    while not until(watcher):
        assert time.monotonic() < deadline, [e["message"] for e in watcher.journal.events]
        watcher.step()
        watcher._save()
        time.sleep(CONFIG.poll)


def created(provider, timeout: float = 10.0):
    """The node as the TPU API has it (it exists from the create call on, CREATING at first)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return provider.client.get_node(name=provider.target.node_name)
        except NotFound:
            assert time.monotonic() < deadline, "no node after create"
            time.sleep(0.1)


def direct(provider):
    """The provider on the nodes.create path (the pod's spec asks for queued resources)."""
    provider.queued = False
    return provider


def phase_is(*phases):
    return lambda w: w.state.incident is not None and w.state.incident.phase in phases


def test_describe_and_ssh_through_iap_with_pinned_host_keys(
    pod: LocalPod, booted, monkeypatch
) -> None:
    raised = []  # exceptions in any thread (paramiko's transports among them)
    monkeypatch.setattr(threading, "excepthook", raised.append)
    booted(pod)
    info = pod_provider(pod.paths.root).describe()
    assert info.state is SliceState.READY and info.health == "HEALTHY"
    assert [w.instance.rsplit("-", 1)[1] for w in info.workers] == ["0", "1"]
    assert all(w.host == w.instance and w.proxy_command and w.port == 22 for w in info.workers)
    with WorkerGroup(info.workers, retries=0) as group:
        out = group.check('echo "$(id -un) $(cat "$TPUPOD_ROOT/booted")"', "whoami")
        transports = [c.client.get_transport() for c in group.connections.values()]
        tunnels = [t.sock.process.pid for t in transports]
    # closed is reaped: a watch that runs for days must not collect a zombie per connection; and
    # reaped only once its transport's thread is done signalling it (else that thread's last
    # os.kill meets a freed pid: ProcessLookupError, or another process)
    assert not [pid for pid in tunnels if Path(f"/proc/{pid}").exists()], tunnels
    for transport in transports:
        transport.join(timeout=5)
    assert not raised, [str(r.exc_value) for r in raised]
    login = info.workers[0].user
    assert [out[i].stdout.split() for i in (0, 1)] == [[login, "0"], [login, "1"]]
    # the same workers directly (from inside the VPC): internal IP, the pod's port
    os.environ["TPUPOD_SSH_VIA"] = "internal"
    try:
        direct = pod_provider(pod.paths.root).describe().workers
    finally:
        del os.environ["TPUPOD_SSH_VIA"]
    assert [w.host for w in direct] == [w.internal_ip for w in info.workers]
    with WorkerGroup(direct, retries=0) as group:
        assert all(o.ok for o in group.run("true").values())
    # a key other than the published one is refused at once, in one line, and not retried
    swapped = [dataclasses.replace(w, host_key=info.workers[1 - w.index].host_key) for w in direct]
    with WorkerGroup(swapped, retries=3) as group:
        started = time.monotonic()
        probes = group.probe()
    assert time.monotonic() - started < 5  # no backoff: retrying cannot help
    assert all(not p.reachable and "does not match" in p.error for p in probes), probes
    assert all("\n" not in p.error for p in probes)


@pytest.mark.skipif(os.geteuid() != 0, reason="the login is unprivileged only in a root pod")
def test_jobctl_runs_as_root_through_sudo_and_a_refusal_is_one_line(pod: LocalPod) -> None:
    info = pod_provider(pod.paths.root).describe()
    for i in (0, 1):  # a jobctl that only root can run: it writes into $TPUPOD_ROOT
        ctl = pod.paths.root / "workers" / str(i) / "tpupod" / "current" / "bootstrap"
        ctl.mkdir(parents=True, exist_ok=True)
        (ctl / "jobctl.sh").write_text('#!/bin/sh\necho "$1" >> "$TPUPOD_ROOT/ctl.log"\n')
        (ctl / "jobctl.sh").chmod(0o755)
    with WorkerGroup(info.workers, retries=0) as group:
        ids = group.check(as_root('id -u; echo "$TPUPOD_ROOT"'), "id as root")
        root = pod.paths.root / "workers"
        assert {i: o.stdout for i, o in ids.items()} == {
            i: f"0\n{root}/{i}/tpupod\n" for i in (0, 1)
        }
        group.jobctl("start")
        logs = group.read("ctl.log")
        assert logs == {0: "start\n", 1: "start\n"}
        # without sudo the login user cannot: the pod reproduces the split
        bare = group.run('"$TPUPOD_ROOT/current/bootstrap/jobctl.sh" start')
        assert not any(o.ok for o in bare.values())
        spool = pod.paths.root / "workers" / "1" / "sudo-spool"
        mode = spool.stat().st_mode & 0o7777
        spool.chmod(0o755)  # the login may no longer ask: sudo -n refuses
        try:
            with pytest.raises(WorkerError) as refused:
                group.jobctl("stop")
        finally:
            spool.chmod(mode)
    user = info.workers[1].user
    assert str(refused.value) == (
        f"worker 1: user {user} cannot run jobctl as root (passwordless sudo refused); "
        f"grant roles/compute.osAdminLogin (OS Login) or add {user} to sudoers"
    )


def test_a_create_whose_node_exists_is_no_failure(pod: LocalPod) -> None:
    """A watch killed after it issued a create and before it saved the operation's name issues
    the create again: the API answers 409 ALREADY_EXISTS (over REST a plain Conflict), which is
    the node being there, not a failed attempt (found by the fault campaign's watch kills)."""
    provider = direct(pod_provider(pod.paths.root))
    assert provider.start_create() is None
    assert provider.describe().state is SliceState.READY


def test_a_stockout_on_recreate_is_retried_and_a_restarted_watch_creates_nothing_twice(
    pod: LocalPod, tmp_path: Path
) -> None:
    provider = direct(pod_provider(pod.paths.root))
    provider.zones = [provider.zone]  # one zone: the stockout is waited out there
    journal = Journal(tmp_path / "journal.jsonl")
    store = IncidentStore(tmp_path / "incident.json")
    first = Watcher(provider, journal, CONFIG, store=store)
    pod.inject_stockout(1)
    pod.preempt(notice=0)
    # watch #1 detects, deletes, creates: the create's operation fails for capacity, and the
    # create issued after the backoff is where watch #1 stops (killed, say)
    drive(first, lambda w: w.state.incident is not None and w.state.incident.stockouts == 1
          and w.state.incident.phase is Phase.AWAITING_CREATE and w.state.incident.operation)  # fmt: skip
    first.close()
    pending = store.load().incident
    assert pending.phase is Phase.AWAITING_CREATE and pending.operation
    node = created(provider)
    # watch #2 polls that same operation to READY and the bootstrap, creating nothing again
    second = Watcher(direct(pod_provider(pod.paths.root)), journal, CONFIG, store=store)
    assert second.state.incident.operation == pending.operation
    drive(second, phase_is(Phase.AWAITING_RESUME))
    second.close()
    assert created(provider).id == node.id
    names = [e["event"] for e in journal.events]
    assert names.count("detected") == names.count("stockout") == names.count("recreated") == 1
    assert names.index("stockout") < names.index("recreated") < names.index("ready")
    assert names[-1] == "bootstrapped"
    # a stockout is neither a preemption nor a failure
    assert (second.state.preemptions, second.state.failures, second.state.incident.stockouts) == (
        1,
        0,
        1,
    )
    assert pod_provider(pod.paths.root).describe().state is SliceState.READY


def test_a_quota_refusal_is_named_backed_off_and_sends_the_slice_to_the_next_zone(
    pod: LocalPod, tmp_path: Path
) -> None:
    """A queued resource refused with HTTP 429 whose body names a quota (as Google's front end
    answers it; google-api-core raises TooManyRequests for it, not ResourceExhausted) is neither
    a crash of the watch nor a stockout: one line names the quota and how to get more, the
    quota budget (not the capacity one) is spent, and the next zone of tpupod:zones is tried."""
    from infra.catalog import quota_metric
    from localpod.gcp.tpu_quota import LOCAL_QUOTA

    provider = pod_provider(pod.paths.root)
    assert provider.queued and provider.zones == ["local-a", "local-b"]
    here = provider.describe().zone
    journal = Journal(tmp_path / "journal.jsonl")
    watcher = Watcher(provider, journal, CONFIG, store=IncidentStore(tmp_path / "incident.json"))
    pod.inject_quota(1, zone=here)
    pod.preempt(notice=0)
    drive(watcher, phase_is(Phase.AWAITING_RESUME))
    watcher.close()
    quota = [e for e in journal.events if e["event"] == "quota"]
    assert len(quota) == 1, [e["message"] for e in journal.events]
    named = quota_metric(LOCAL_QUOTA, spot=True, scope="zone")
    assert named in quota[0]["message"] and "IAM & Admin > Quotas" in quota[0]["message"]
    there = "local-b" if here == "local-a" else "local-a"
    assert (quota[0]["zone"], quota[0]["next_zone"]) == (here, there)
    names = [e["event"] for e in journal.events]
    assert "stockout" not in names and "error" not in names and names.count("recreated") == 1
    assert (watcher.state.incident.stockouts, watcher.state.incident.quota_refusals) == (0, 1)
    info = pod_provider(pod.paths.root).describe()
    assert (info.state, info.zone) == (SliceState.READY, there)


def test_an_outage_of_the_tpu_api_is_retried_and_recovery_goes_on(
    pod: LocalPod, tmp_path: Path
) -> None:
    """HTTP 503 UNAVAILABLE (google-cloud-tpu sets no retry of its own): a transient error, each
    call journaled as one `error` line and tried again on a later poll; never a give-up."""
    provider = pod_provider(pod.paths.root)
    journal = Journal(tmp_path / "journal.jsonl")
    watcher = Watcher(provider, journal, CONFIG, store=IncidentStore(tmp_path / "incident.json"))
    pod.preempt(notice=0)
    pod.inject_unavailable(3)
    drive(watcher, phase_is(Phase.AWAITING_RESUME))
    watcher.close()
    assert pod.inject_unavailable(0) == 0  # all three were answered, and retried past
    errors = [e["message"] for e in journal.events if e["event"] == "error"]
    assert errors and all("unavailable" in m.lower() for m in errors), errors
    names = [e["event"] for e in journal.events]
    assert "gave_up" not in names and names.count("recreated") == 1, names
