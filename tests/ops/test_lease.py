"""The lease and the bucket state, against the local pod's GCS emulator through google-cloud-storage:
one watcher acts, a second observes while the lease lives and takes over once it expires; the
incident and the journal survive the watcher that wrote them."""

from __future__ import annotations

import threading
import time

import pytest

from localpod.gcp.storage import running_emulator
from ops.cloud.target import SshSettings, Target
from ops.watch.incident import Incident, WatchState
from ops.watch.lease import Lease, LeaseLost, Observer, run_leased
from ops.watch.remote_state import RemoteState
from ops.watch.transitions import Phase
from tests.ops.conftest import dummy_token

BUCKET = "tpupod-lease-test"


@pytest.fixture(scope="module")
def storage_url():
    with running_emulator(BUCKET) as url:
        yield url


def make_state(url: str, stack: str) -> RemoteState:
    spec = {
        "parent": "projects/p/locations/z",
        "node_id": "n",
        "node": {"metadata": {"tpupod-bucket": BUCKET}},
    }
    target = Target(stack, "p", "z", "n", spec, SshSettings(None, None), storage_endpoint=url,
                    token_file=dummy_token())  # a bare emulator: any token goes  # fmt: skip
    return RemoteState.for_target(target)


def test_one_holder_a_second_observes_then_takes_over_after_expiry(storage_url):
    state = make_state(storage_url, "held")
    first, second = Lease(state, "vm-a", ttl=1.5), Lease(state, "laptop", ttl=1.5)
    assert first.acquire()
    assert not second.acquire()  # live lease held by someone else: observe only
    first.renew(force=True)  # the holder's heartbeat
    assert state_view(first).holder == "vm-a"
    time.sleep(1.7)  # vm-a stops renewing (killed, VM gone)
    assert second.acquire()
    assert state_view(second).holder == "laptop"
    with pytest.raises(LeaseLost):
        first.renew(force=True)  # the old holder comes back: it must stop acting


def test_the_same_holder_restarted_takes_its_lease_back_at_once(storage_url):
    state = make_state(storage_url, "restart")
    assert Lease(state, "watcher-vm", ttl=60).acquire()
    assert not Lease(state, "laptop", ttl=60).acquire()
    assert Lease(state, "watcher-vm", ttl=60).acquire()  # systemd restarted it


def test_two_racing_for_a_free_lease_one_wins(storage_url):
    state = make_state(storage_url, "race")
    leases = [Lease(state, f"w{i}", ttl=60) for i in range(4)]
    views = [lease.read() for lease in leases]
    assert views == [None] * 4
    won = [lease._write(0, time.time()) for lease in leases]  # all saw no lease: generation 0
    assert won.count(True) == 1


def test_a_second_watcher_acts_only_after_the_first_lease_expires(storage_url):
    state = make_state(storage_url, "run")
    holder = Lease(state, "vm", ttl=2.0)
    assert holder.acquire()
    acted: list[float] = []

    def act(guard) -> int:
        guard()
        acted.append(time.time())
        return 0

    thread = threading.Thread(
        target=run_leased, args=(Lease(state, "laptop", ttl=2.0), Observer(state, None), act, 0.2)
    )
    thread.start()
    time.sleep(1.0)
    assert not acted  # lease live: the second watcher only observes
    thread.join(10)
    # took over once the lease expired: 2 s after the holder's own timestamp (taken before its
    # upload, so a clock started after acquire() returned would shorten the wait by the upload)
    assert acted and acted[0] >= holder.renewed + 2.0 - 0.1
    assert Lease(state, "x", 1).read().live() is False  # released when done


def test_incident_and_journal_survive_the_watcher(storage_url):
    state = make_state(storage_url, "survive")
    inc = Incident("preemption", "node PREEMPTED", time.time(), 12, phase=Phase.AWAITING_CREATE)
    inc.operation = "projects/p/locations/z/operations/op-1"
    state.save(WatchState(failures=1, preemptions=2, incident=inc))
    for i in range(3):
        state.append({"time": time.time(), "event": f"e{i}", "message": str(i)})
    again = make_state(storage_url, "survive")  # a new process, a new client
    loaded = again.load()
    assert loaded.incident.phase is Phase.AWAITING_CREATE
    assert loaded.incident.operation == inc.operation and loaded.failures == 1
    assert [r["event"] for _, r in again.read_journal()] == ["e0", "e1", "e2"]
    assert [r["event"] for _, r in again.read_journal(last=1)] == ["e2"]
    again.clear()
    assert make_state(storage_url, "survive").load() is None


def state_view(lease: Lease):
    return lease.read()


def test_observe_only_prints_the_journal_and_returns_when_the_run_is_done(storage_url):
    from rich.console import Console

    from ops.watch.remote_watch import observe

    state = make_state(storage_url, "observe")
    state.append({"time": time.time(), "event": "watching", "message": "stack observe"})
    console = Console(record=True, width=200)
    finisher = threading.Timer(
        0.5, lambda: state.append({"time": time.time(), "event": "done", "message": "all done"})
    )
    finisher.start()
    assert observe(state, Observer(state, console), poll=0.2) == 0
    text = console.export_text()
    assert "[watcher]" in text and "all done" in text and "stack observe" in text


def test_forensics_numbers_are_listed_once_then_kept_by_the_puts(storage_url):
    """A hang's restart waits on forensics: the bucket's incidents are listed by the first
    capture only (a laptop taking over goes on from the VM's numbers) and kept up by this
    process's puts. Control: a second process, which has not listed, sees the first's files."""
    vm = make_state(storage_url, "forensics")
    vm.put_forensics(3, "worker-0.txt", "stacks")  # before any listing: nothing cached
    assert vm.forensics_numbers() == {3}
    listed = []
    vm.bucket.list_blobs = lambda *a, **k: listed.append(a) or []  # a listing would be seen
    vm.put_forensics(4, "worker-0.txt", "stacks")
    assert vm.forensics_numbers() == {3, 4} and listed == []
    assert make_state(storage_url, "forensics").forensics_numbers() == {3, 4}
