"""The watcher VM on the local pod: it recovers a preemption with no `tpupod watch` started by the
test and continues the same incident after being killed mid-recovery (one recreate); its
recovery of a hang, a crash and a preemption, compared bitwise with an uninterrupted run, is
test_demo.py's. Its way in to the
workers is OS Login: a key imported through the pod's importSshPublicKey works for that POSIX user,
any other is refused."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from localpod.gcp import identities
from localpod.gcp.authz import POLICY_FILE
from localpod.gcp.iam_policy import COMPUTE_STACK, Policy
from localpod.gcp.iam_report import summarize
from localpod.pod import LocalPod
from localpod.vm import watcher_vm
from ops.cli import main
from ops.cloud.target import local_target
from ops.fleet import oslogin
from ops.watch.remote_state import RemoteState

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
STEPS = 30


def ssh_as(worker, user: str, key_file: Path) -> str:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    try:
        client.connect(worker.host, worker.port, username=user, key_filename=str(key_file),
                       look_for_keys=False, allow_agent=False, timeout=15)  # fmt: skip
        _, out, _ = client.exec_command("echo in")
        return out.read().decode().strip()
    finally:
        client.close()


def policy_of(pod: LocalPod) -> Policy:
    return Policy.from_json(json.loads((pod.paths.root / POLICY_FILE).read_text()))


def test_os_login_key_works_only_once_imported_and_only_for_its_user(pod_factory, tmp_path):
    pod = pod_factory()
    pod.up()
    endpoint = json.loads(pod.paths.endpoints.read_text())["oslogin"]
    worker = pod.describe().workers[0]
    watcher = identities.add_watcher(pod.paths.root, policy_of(pod), pod.paths.endpoints)
    key = tmp_path / "watcher_key"
    user = oslogin.import_key(endpoint, watcher["email"], oslogin.ensure_key(key),
                              token_file=watcher["token_file"])  # as itself  # fmt: skip
    assert user.startswith("sa_")
    assert ssh_as(worker, user, key) == "in"  # imported, and roles/compute.osAdminLogin: in
    # The workers' account may import a key to its own profile, but holds no OS Login role:
    # OS Login refuses its login, whatever key it brings.
    workers = pod.endpoints()["identities"]["worker-0"]
    worker_key = tmp_path / "worker_key"
    worker_user = oslogin.import_key(endpoint, workers["email"], oslogin.ensure_key(worker_key),
                                     token_file=workers["token_file"])  # fmt: skip
    with pytest.raises(paramiko.AuthenticationException):
        ssh_as(worker, worker_user, worker_key)
    with pytest.raises(oslogin.OsLoginError, match="403"):  # nobody manages another's profile
        oslogin.import_key(endpoint, watcher["email"], oslogin.ensure_key(worker_key),
                           token_file=workers["token_file"])  # fmt: skip
    stranger = tmp_path / "stranger_key"
    oslogin.ensure_key(stranger)
    with pytest.raises(paramiko.AuthenticationException):
        ssh_as(worker, user, stranger)  # a key never imported
    with pytest.raises(paramiko.AuthenticationException):
        ssh_as(worker, "sa_1", key)  # the imported key, but another account's user


@pytest.fixture
def watched_pod(tmp_path: Path, monkeypatch) -> Iterator[LocalPod]:
    """A 2-worker pod on the real bootstrap and its watcher VM; all stopped at the end."""
    monkeypatch.setenv("TPUPOD_WATCH_ARGS", "--hang-timeout 10 --backoff 0.5")
    pod = LocalPod(tmp_path / "pod", workers=2,
                   trainer_args=f"--config tiny --steps {STEPS} --set checkpoint_every=10")  # fmt: skip
    try:
        pod.up()
        watcher_vm.start(pod.paths.root)
        yield pod
    finally:
        watcher_vm.stop(pod.paths.root)
        pod.down()


def steps(pod: LocalPod) -> list[int]:
    found = []
    for i in range(2):
        try:
            found.append(json.loads((pod.paths.tpupod_root(i) / "status.json").read_text())["step"])
        except (OSError, ValueError, KeyError):
            found.append(-1)
    return found


def wait(what: str, check, timeout: float = 400.0, poll: float = 0.5):
    deadline = time.time() + timeout
    while not (found := check()):
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)
    return found


def test_the_watcher_vm_recovers_alone_and_survives_being_killed(watched_pod, capsys):
    pod = watched_pod
    state = RemoteState.for_target(local_target(pod.paths.root))

    def events() -> list[dict]:
        return [record for _, record in state.read_journal()]

    def has(name: str, kind: str | None = None) -> bool:
        return any(e["event"] == name and kind in (None, e.get("kind")) for e in events())

    wait("the watcher watching", lambda: has("watching"), 120)
    wait("step 12", lambda: min(steps(pod)) >= 12)
    pod.preempt(0, wait=False)
    # Mid-recovery (delete or create issued, in the bucket's incident): kill the watch process.
    wait("a recreate under way", lambda: (s := state.load()) and s.incident
         and s.incident.phase in ("awaiting-delete", "awaiting-create", "awaiting-ready"), 120)  # fmt: skip
    victim = watcher_vm.watch_pid(pod.paths.root)
    os.kill(victim, signal.SIGKILL)
    wait("the restarted watcher continuing", lambda: has("continuing"), 60)
    assert watcher_vm.watch_pid(pod.paths.root) != victim  # the supervisor restarted it
    wait("the preemption resumed", lambda: has("resumed", "preemption"))
    wait("done", lambda: has("done"), 600)

    names = [e["event"] for e in events()]
    assert names.count("recreated") == 1, names  # one recreate, not two, across the kill
    assert [e["kind"] for e in events() if e["event"] == "detected"] == ["preemption"]
    done = next(e for e in events() if e["event"] == "done")
    assert done["step"] == STEPS and done["preemptions"] == 1 and done["failures"] == 0
    # `tpupod goodput` reads the same journal from the bucket, as an operator would.
    assert main(["goodput", "--stack", "local", "--pod-dir", str(pod.paths.root), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["finished"] and figures["incidents"] == 1 and figures["final_step"] == STEPS
    assert figures["seconds"]["infrastructure recovery"] > 0, figures
    lease = json.loads(state.blob("lease.json").download_as_bytes())
    assert lease["holder"] == watcher_vm.HOLDER and lease["expires"] <= time.time()  # released
    # Against the stack's own grants: every call of the run allowed (the watcher's recreate
    # included), and every role the watcher and the workers hold used (least privilege).
    iam = summarize(pod.paths.root)
    assert iam.least_privilege, iam.lines()
    assert {m.split("@")[0] for m in iam.unused} >= {"serviceAccount:tpupod-local",
                                                     "serviceAccount:tpupod-local-watch"}  # fmt: skip


@pytest.mark.slow
def test_the_watcher_vm_recovers_a_compute_engine_group(tmp_path, monkeypatch):
    """`tpupod local up --api compute --watcher` (issue 51): the watcher VM, as the watcher
    account of a Compute Engine stack (its role: what the catalog says the group's calls need),
    brings the preempted group back and the job resumes to its end. `slow` (about two minutes;
    CI keeps under 20): CI recovers a group with `tpupod watch` in tests/e2e/test_jobs.py."""
    monkeypatch.setenv("TPUPOD_WATCH_ARGS", "--hang-timeout 10 --backoff 0.5")
    pod = LocalPod(tmp_path / "pod", workers=2, api="compute", iam_stack=COMPUTE_STACK,
                   trainer_args=f"--config tiny --steps {STEPS} --set checkpoint_every=10")  # fmt: skip
    try:
        pod.up()
        watcher_vm.start(pod.paths.root)
        state = RemoteState.for_target(local_target(pod.paths.root))

        def has(name: str, kind: str | None = None) -> bool:
            return any(r["event"] == name and kind in (None, r.get("kind"))
                       for _, r in state.read_journal())  # fmt: skip

        wait("the watcher watching", lambda: has("watching"), 120)
        wait("step 12", lambda: min(steps(pod)) >= 12)
        before = [w.hostname for w in pod.describe().workers]
        pod.preempt(0, wait=False)
        wait("the preemption resumed", lambda: has("resumed", "preemption"))
        wait("done", lambda: has("done"), 600)
        assert not set(before) & {w.hostname for w in pod.describe().workers}  # a new group
        iam = summarize(pod.paths.root)  # every call allowed, every role held used
        assert iam.least_privilege, iam.lines()
    finally:
        watcher_vm.stop(pod.paths.root)
        pod.down()
