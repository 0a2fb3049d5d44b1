"""The Fabric layer against real loopback SSH servers: probes, jobctl, retries."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import sys
import threading
import time

import pytest

from contract.status import JobState
from ops.cloud.slice import Worker
from ops.fleet.job_status import JobRules
from ops.fleet.workers import WorkerError, WorkerGroup
from ops.watch import Limits
from ops.watch.conditions import WorkerCondition, judge_worker
from trainer.status import StatusFile


def workers_of(servers):
    return [
        Worker(i, "127.0.0.1", s.port, "tpupod", str(s.key_file), host_key=s.host_key)
        for i, s in enumerate(servers)
    ]


def install_jobctl(root, log):
    ctl = root / "current" / "bootstrap" / "jobctl.sh"
    ctl.parent.mkdir(parents=True)
    ctl.write_text(f'#!/bin/sh\necho "$1 ${{TPUPOD_ATTEMPT:-}} $(date +%s.%N)" >> {log}\n')
    ctl.chmod(0o755)


def test_probe_reads_every_status_file(pod):
    root0 = pod[0].root
    (root0 / "bootstrap.json").write_text(json.dumps({"state": "ok", "phase": "trainer"}))
    StatusFile(root0 / "status.json").update(state=JobState.TRAINING, step=7, loss=2.5)
    (root0 / "job.exit").write_text("75\n")
    (root0 / "job.last-exit").write_text("137\n")
    (root0 / "job.term").write_text(f"{time.time() - 5}\n")
    (root0 / "job.attempt").write_text("4\n")
    (pod[1].root / "status.json").write_text('{"step": 3, "time": 12.5}')  # a job's own
    with WorkerGroup(workers_of(pod)) as group:
        p0, p1 = group.probe()
    assert p0.reachable and p0.bootstrap_state == "ok"
    assert p0.status.step == 7 and p0.status.state == "training" and p0.status.loss == 2.5
    assert p0.exit_code == 75 and p0.exit_mtime > time.time() - 60 and p0.last_exit == 137
    assert p0.attempt == 4 and time.time() - 60 < p0.term_at < time.time()
    assert p0.heartbeat_age < 30 and abs(p0.now - time.time()) < 5
    assert p1.reachable and p1.bootstrap is None and p1.exit_code is None and p1.attempt is None
    assert (p1.status.step, p1.status.updated, p1.status.heartbeat) == (3, 12.5, None)
    verdict = judge_worker(p1, since=0, limits=Limits(), rules=JobRules())
    assert verdict.condition is WorkerCondition.BOOTSTRAPPING


def test_restart_runs_stop_then_clear_then_start_on_every_worker(pod, tmp_path):
    logs = [tmp_path / f"ctl-{i}.log" for i in range(len(pod))]
    for server, log in zip(pod, logs, strict=True):
        install_jobctl(server.root, log)
    with WorkerGroup(workers_of(pod)) as group:
        group.restart(attempt=5)
    per_worker = [[line.split() for line in log.read_text().splitlines()] for log in logs]
    # each worker clears after its own stop, in the same round trip; a start comes only after
    # every worker has cleared (each line is stamped with its time)
    for lines in per_worker:
        assert [line[0] for line in lines] == ["stop", "clear-locks", "start"]
        assert lines[2][1] == "5"  # the attempt
    cleared = max(float(lines[1][-1]) for lines in per_worker)
    assert all(float(lines[2][-1]) >= cleared for lines in per_worker)


def test_failure_names_the_worker(pod, tmp_path):
    install_jobctl(pod[0].root, tmp_path / "ctl.log")  # worker 1 has no jobctl
    with WorkerGroup(workers_of(pod), retries=0) as group, pytest.raises(WorkerError) as err:
        group.jobctl("start")
    assert "worker 1" in str(err.value) and "worker 0" not in str(err.value)


def test_transient_ssh_failure_is_retried_with_backoff(pod):
    workers = workers_of(pod)
    pod[1].stop_listening()  # connection refused until it comes back
    comes_back = threading.Timer(1.0, pod[1].start)
    comes_back.start()
    try:
        with WorkerGroup(workers, retries=4, backoff=0.5) as group:
            outcomes = group.run("echo hi")
    finally:
        comes_back.join(15)  # its start() done before the teardown stops the server
    assert all(o.ok and o.stdout.strip() == "hi" for o in outcomes.values()), outcomes


def test_unreachable_worker_is_reported_not_raised(pod):
    workers = workers_of(pod)
    pod[1].stop_listening()
    with WorkerGroup(workers, retries=1, backoff=0.1, connect_timeout=2) as group:
        p0, p1 = group.probe()
    assert p0.reachable and not p1.reachable and p1.error
    assert judge_worker(p1, 0, Limits()).condition is WorkerCondition.UNREACHABLE


def test_a_worker_without_a_published_host_key_is_refused(pod):
    workers = [dataclasses.replace(w, host_key=None) for w in workers_of(pod)]
    with WorkerGroup(workers, retries=2, backoff=5) as group:
        p0, _ = group.probe()  # refused at once: no retry, no backoff
    assert not p0.reachable and p0.error.startswith(
        "127.0.0.1: no host key in the node's guest attributes: refused"
    )
    assert "constraints/compute.disableGuestAttributesAccess" in p0.error  # why, if it lasts
    assert pod[0].commands == []


def test_no_threads_or_connections_leak(pod):
    before = threading.active_count()
    with WorkerGroup(workers_of(pod)) as group:
        for _ in range(3):
            group.probe()
    deadline = time.time() + 5
    while threading.active_count() > before and time.time() < deadline:
        time.sleep(0.1)
    assert threading.active_count() <= before


class FreezingRelay:
    """A TCP relay to a server that can go silent without closing anything: what a connection to
    a VM preempted without a FIN looks like from the watcher (bytes go out, nothing comes back)."""

    def __init__(self, port: int):
        self.target, self.frozen = port, threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target))
                self.sockets += [client, server]
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not self.frozen.is_set():
                    sink.sendall(data)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def test_a_peer_gone_silent_fails_the_command_in_bounded_time(pod):
    """A session on a connection whose peer stopped answering is given up after the connect
    timeout, not paramiko's hour: a probe racing a preemption must not hold the watch."""
    relay = FreezingRelay(pod[0].port)
    worker = dataclasses.replace(workers_of(pod)[0], port=relay.port)
    try:
        with WorkerGroup([worker], retries=0, connect_timeout=2) as group:
            assert group.run("echo hi")[0].stdout == "hi\n"  # the connection is open and kept
            relay.frozen.set()
            began = time.monotonic()
            (outcome,) = group.run("echo again").values()
            took = time.monotonic() - began
        assert not outcome.ok and outcome.exited is None, outcome
        assert took < 10, took
    finally:
        relay.close()


def test_a_worker_that_accepts_but_never_answers_costs_a_probe_seconds(pod):
    """A tunnel to a VM that is going away accepts and then says nothing (no SSH banner): the
    probe gives up after its connect timeout, retried once, whatever the group's retries, so
    the watch sees the TPU API's verdict on its next poll. Before the banner was bounded this
    took four banner waits of 30 s."""
    relay = FreezingRelay(pod[0].port)
    relay.frozen.set()  # from the first byte: no banner ever arrives
    worker = dataclasses.replace(workers_of(pod)[0], port=relay.port)
    try:
        with WorkerGroup([worker], retries=3, backoff=0.1, connect_timeout=2) as group:
            began = time.monotonic()
            (probe,) = group.probe()
            took = time.monotonic() - began
        assert not probe.reachable and probe.error, probe
        assert took < 8, took  # two attempts of 2 s, and the backoff between them
    finally:
        relay.close()


RELAY = """
import os, socket, sys, threading
peer = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while data := os.read(0, 65536):
        peer.sendall(data)
threading.Thread(target=up, daemon=True).start()
while data := peer.recv(65536):
    os.write(1, data)
"""


def test_a_tunnel_that_ends_ends_its_connection_and_the_next_command_reconnects(
    pod, tmp_path, monkeypatch
):
    """Through a ProxyCommand (as through IAP): when the proxy program ends (the VM went away),
    the connection is closed at once, so nothing waits on it, and the next command opens a
    new tunnel. Negative control: paramiko's own ProxyCommand reads the end as "nothing yet",
    its transport stays up (spinning) and a session waiting on it waits forever."""
    from paramiko.proxy import ProxyCommand

    from ops.fleet import ssh_connections

    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    proxy = f"{sys.executable} {relay} 127.0.0.1 {pod[0].port}"
    worker = dataclasses.replace(workers_of(pod)[0], proxy_command=proxy)

    def tunnel_ends(group: WorkerGroup) -> bool:
        assert group.run("echo hi")[0].stdout == "hi\n"
        transport = group.connections[0].client.get_transport()
        transport.sock.process.kill()  # not reaped here: closing the group does that
        deadline = time.monotonic() + 3
        while transport.is_active() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not transport.is_active()

    with WorkerGroup([worker], retries=0, connect_timeout=2) as group:
        assert tunnel_ends(group)
        (again,) = group.run("echo again").values()
        assert again.ok and again.stdout == "again\n", again
    monkeypatch.setattr(ssh_connections, "EndingProxyCommand", ProxyCommand)  # paramiko's
    with WorkerGroup([worker], retries=0, connect_timeout=2) as group:
        assert not tunnel_ends(group)  # the bug: up 3 s after its tunnel ended
