"""A local worker behaves like a TPU VM for SSH, privileges and sudo (issue 14 items 4 and 5).

One 2-worker pod boots a startup script that, as root, installs the real jobctl.sh and launcher
and starts a stand-in job with them. Everything is checked with the real clients: OpenSSH's ssh
and scp, Fabric/paramiko, and google-auth. When the suite runs as root, the login is "nobody" and
the job root's; as a developer, the login is that developer (the root-only checks skip).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import fabric
import paramiko
import pytest

from localpod.gcp import tokens
from localpod.pod import LocalPod
from localpod.state import PROJECT_ROOT

AS_ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not AS_ROOT, reason="the login is the pod's own user")

STARTUP_SCRIPT = rf"""#!/bin/bash
set -euo pipefail
bundle="$TPUPOD_ROOT/bundles/stand-in"
mkdir -p "$bundle/bootstrap" "$bundle/.venv/bin" "$bundle/job"
cp {shlex.quote(str(PROJECT_ROOT / "bootstrap"))}/jobctl*.sh "$bundle/bootstrap/"
cp {shlex.quote(str(PROJECT_ROOT / "bootstrap" / "jobrun.py"))} "$bundle/bootstrap/"
cp -r {shlex.quote(str(PROJECT_ROOT / "contract"))} "$bundle/"
ln -sfn {shlex.quote(sys.executable)} "$bundle/.venv/bin/python"
ln -sfn "$bundle" "$TPUPOD_ROOT/current"
echo '{{"run": "trap \"exit 0\" TERM; sleep 3600 & wait", "progress": "none"}}' \
  > "$TPUPOD_ROOT/job.json"
echo "$bundle/.venv" > "$TPUPOD_ROOT/job.venv"
echo "TPUPOD_RUN_DIR=gs://tpupod-local/runs/local/r" > "$TPUPOD_ROOT/job.env"
"$TPUPOD_ROOT/current/bootstrap/jobctl.sh" start
echo '{{"step": 1}}' > "$TPUPOD_ROOT/status.json"  # after the start: the launcher clears it
touch "$TPUPOD_ROOT/booted"
"""
JOBCTL = '"$TPUPOD_ROOT/current/bootstrap/jobctl.sh"'
SUDO_JOBCTL = f'sudo -n env TPUPOD_ROOT="$TPUPOD_ROOT" {JOBCTL}'


@pytest.fixture(scope="module")
def vm_pod() -> Iterator[LocalPod]:
    """Outside pytest's base dir: every other pytest session run as root resets that to 0700,
    which would lock the login user out of its HOME in the middle of a test."""
    root = Path(tempfile.mkdtemp(prefix="tpupod-vm-"))
    script = root / "startup.sh"
    script.write_text(STARTUP_SCRIPT)
    local_pod = LocalPod(root / "pod", workers=2, startup_script=script)
    try:
        local_pod.up()
        yield local_pod
    finally:
        local_pod.down()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def ends(vm_pod: LocalPod) -> dict:
    endpoints = json.loads((vm_pod.paths.root / "endpoints.json").read_text())
    for worker in vm_pod.describe().workers:
        wait = "until [ -e $TPUPOD_ROOT/booted ]; do sleep 0.1; done"
        assert ssh(endpoints, worker.host, wait, timeout=60).returncode == 0
    return endpoints


def ssh_options(endpoints: dict, known_hosts: str | None = None) -> list[str]:
    """Strict checking against the pod's known_hosts (or `known_hosts`: OpenSSH takes the first
    value given for an option)."""
    known = known_hosts or endpoints["ssh"]["known_hosts"]
    return [
        *("-i", endpoints["ssh"]["key_file"], "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"),
        *("-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}"),
    ]


def ssh(
    endpoints: dict, host: str, command: str, *extra: str, user: str | None = None, timeout=30
) -> subprocess.CompletedProcess:
    """OpenSSH to a worker by address and port, strict host key checking."""
    port = str(endpoints["ssh"]["ports"][host])
    target = f"{user or endpoints['ssh']['user']}@{host}"
    argv = ["ssh", "-p", port, *ssh_options(endpoints), *extra, target, command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def proxy_command(endpoints: dict) -> str:
    """The endpoints' IAP command as ops fills it: the instance left to OpenSSH's %h."""
    iap = endpoints["ssh"]["iap_command"]
    return iap.format(instance="%h", zone=endpoints["zone"], project=endpoints["project"])


def instance_names(vm_pod: LocalPod) -> list[str]:
    return [w.hostname for w in vm_pod.describe().workers]


def test_login_is_the_unprivileged_user_with_its_home_and_a_pty_when_asked(vm_pod, ends) -> None:
    worker = vm_pod.describe().workers[0]
    user = ends["ssh"]["user"]
    assert user == (pwd.getpwuid(os.geteuid()).pw_name if not AS_ROOT else "nobody")
    out = ssh(ends, worker.host, 'id -un; echo "$HOME|$USER|$LOGNAME"; stat -c %U "$HOME"; tty')
    name, env, owner, tty = out.stdout.splitlines()
    assert (name, owner) == (user, user)
    assert env == f"{vm_pod.paths.root}/workers/0/home|{user}|{user}"
    assert tty == "not a tty" and out.returncode == 1
    with_pty = ssh(ends, worker.host, "tty", "-tt")
    assert with_pty.returncode == 0, with_pty.stderr
    assert re.fullmatch(r"/dev/pts/\d+", with_pty.stdout.strip())
    if AS_ROOT:  # the agent put the worker in its own UTS namespace named after the instance
        assert ssh(ends, worker.host, "hostname").stdout.strip() == worker.hostname


def test_another_user_name_is_refused(vm_pod, ends) -> None:
    worker = vm_pod.describe().workers[0]
    refused = ssh(ends, worker.host, "true", user="root")
    assert refused.returncode == 255
    assert "Permission denied (publickey)" in refused.stderr


def test_scp_exits_zero_and_writes_as_the_login_user(vm_pod, ends, tmp_path: Path) -> None:
    worker = vm_pod.describe().workers[0]
    source = tmp_path / "notes.txt"
    source.write_text("hello worker\n")
    port = str(ends["ssh"]["ports"][worker.host])
    user = ends["ssh"]["user"]

    def scp(destination: str, *flags: str) -> subprocess.CompletedProcess:
        argv = ["scp", *flags, "-P", port, *ssh_options(ends), str(source), destination]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)

    for flags in ((), ("-O",)):  # SFTP (OpenSSH's default) and the legacy scp protocol
        done = scp(f"{user}@{worker.host}:", *flags)
        assert done.returncode == 0, done.stderr
    copied = vm_pod.paths.root / "workers/0/home/notes.txt"
    assert copied.read_text() == "hello worker\n"
    assert pwd.getpwuid(copied.stat().st_uid).pw_name == user
    if AS_ROOT:  # root's job files are not the login's to write
        denied = scp(f"{user}@{worker.host}:{vm_pod.paths.root}/workers/0/tpupod/notes.txt")
        assert denied.returncode == 1 and "Permission denied" in denied.stderr


def test_probe_reads_root_files_but_cannot_change_them(vm_pod, ends) -> None:
    worker = vm_pod.describe().workers[0]
    probe = ssh(ends, worker.host, 'cat "$TPUPOD_ROOT/status.json"; date +%s')
    assert probe.returncode == 0 and '{"step": 1}' in probe.stdout
    if AS_ROOT:
        change = ssh(ends, worker.host, 'touch "$TPUPOD_ROOT/x"')
        assert change.returncode != 0 and "Permission denied" in change.stderr
        kill = ssh(ends, worker.host, 'kill -0 "$(cat "$TPUPOD_ROOT/job.pid")"')
        assert kill.returncode == 1 and "Operation not permitted" in kill.stderr


def test_job_stop_needs_sudo_and_works_with_it(vm_pod, ends) -> None:
    worker = vm_pod.describe().workers[1]
    assert ssh(ends, worker.host, f"{JOBCTL} status").returncode == 0
    if AS_ROOT:
        plain = ssh(ends, worker.host, f"TPUPOD_STOP_TIMEOUT=2 {JOBCTL} stop")
        assert plain.returncode != 0
        assert ssh(ends, worker.host, f"{JOBCTL} status").stdout.startswith("running")
    sudo_stop = SUDO_JOBCTL.replace("env ", "env TPUPOD_STOP_TIMEOUT=5 ") + " stop"
    stop = ssh(ends, worker.host, sudo_stop)
    assert stop.returncode == 0, stop.stderr
    assert "job stopped" in stop.stdout
    status = ssh(ends, worker.host, f"{JOBCTL} status")
    assert status.returncode == 3 and status.stdout.startswith("exited")
    start = ssh(ends, worker.host, f"{SUDO_JOBCTL} start")
    assert start.returncode == 0 and "job started" in start.stdout, start.stderr
    owner = ssh(ends, worker.host, 'stat -c %U "/proc/$(cat "$TPUPOD_ROOT/job.pid")"')
    assert owner.stdout.strip() == ("root" if AS_ROOT else ends["ssh"]["user"])


def test_sudo_passes_arguments_stdin_output_and_exit_status(vm_pod, ends) -> None:
    worker = vm_pod.describe().workers[0]
    script = 'cat; echo "$A" $(id -un); echo err >&2; exit 7'
    command = f"echo piped | sudo -n env A='x y' sh -c '{script}'"
    done = ssh(ends, worker.host, command)
    assert done.returncode == 7
    assert done.stdout == f"piped\nx y {'root' if AS_ROOT else ends['ssh']['user']}\n"
    assert done.stderr == "err\n"
    missing = ssh(ends, worker.host, "sudo -n no-such-command")
    assert (missing.returncode, missing.stderr) == (1, "sudo: no-such-command: command not found\n")


@root_only
def test_sudo_refuses_other_users_and_a_missing_agent(vm_pod) -> None:
    """The shim refuses at once; the agent independently ignores requests it cannot trust."""
    shim = vm_pod.paths.root / "workers/0/bin/sudo"
    as_daemon = {"user": "daemon", "group": "daemon", "extra_groups": []}

    def run(path: Path, **kwargs) -> subprocess.CompletedProcess:
        argv = [str(path), "-n", "id", "-u"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/", **kwargs)

    refused = run(shim, **as_daemon)
    assert (refused.returncode, refused.stderr) == (1, "sudo: a password is required\n")
    text = shim.read_text()
    daemon_uid = pwd.getpwnam("daemon").pw_uid
    forged = vm_pod.paths.root / "forged-sudo"  # skips the shim's own check: the agent refuses
    forged.write_text(re.sub(r"LOGIN_UID=\d+", f"LOGIN_UID={daemon_uid}", text))
    forged.chmod(0o755)
    assert run(forged, **as_daemon).stderr == "sudo: a password is required\n"
    no_agent = vm_pod.paths.root / "orphan-sudo"
    no_agent.write_text(re.sub(r"AGENT_PID=\d+", "AGENT_PID=999999999", text))
    no_agent.chmod(0o755)
    nobody = {"user": "nobody", "group": "nogroup", "extra_groups": []}
    assert run(no_agent, **nobody).stderr == "sudo: a password is required\n"
    assert run(shim, **nobody).stdout == "0\n"


def test_openssh_through_the_iap_stand_in_checks_host_keys(vm_pod, ends, tmp_path) -> None:
    names = instance_names(vm_pod)
    proxy = ["-o", f"ProxyCommand={proxy_command(ends)}"]
    user = ends["ssh"]["user"]

    def via_iap(name: str, known_hosts: str) -> subprocess.CompletedProcess:
        options = [*ssh_options(ends, known_hosts), *proxy]
        argv = ["ssh", *options, f"{user}@{name}", "echo $USER"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)

    known = ends["ssh"]["known_hosts"]
    for name in names:
        done = via_iap(name, known)
        assert (done.returncode, done.stdout) == (0, f"{user}\n"), done.stderr
    wrong = via_iap(f"{ends['node']}-w-0", known)
    assert wrong.returncode == 255
    assert "ERROR: (gcloud.compute.start-iap-tunnel) Could not fetch resource" in wrong.stderr
    swapped = tmp_path / "known_hosts"  # worker 1's key under worker 0's name: not that host
    lines = Path(known).read_text().splitlines()
    key_1 = next(line.split(" ", 1)[1] for line in lines if line.startswith(names[1]))
    swapped.write_text(f"{names[0]} {key_1}\n")
    mismatch = via_iap(names[0], str(swapped))
    assert mismatch.returncode == 255 and "Host key verification failed" in mismatch.stderr


def test_iap_stand_in_refuses_what_gcloud_would(vm_pod, ends) -> None:
    name = instance_names(vm_pod)[0]
    base = [sys.executable, "-m", "localpod.vm.iap"]
    common = ["--listen-on-stdin", "--endpoints", str(vm_pod.paths.root / "endpoints.json")]
    cases = {
        "port": [name, "2222", "--zone", ends["zone"], "--project", ends["project"]],
        "zone": [name, "22", "--zone", "elsewhere-b", "--project", ends["project"]],
        "project": [name, "22", "--zone", ends["zone"], "--project", "someone-else"],
        "instance": ["no-such-vm", "22", "--zone", ends["zone"], "--project", ends["project"]],
    }
    for case, args in cases.items():
        argv = [*base, *args, *common]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=-3)
        assert done.returncode == 1, case
        assert len(done.stderr.splitlines()) == 1, (case, done.stderr)
        assert done.stderr.startswith("ERROR: (gcloud.compute.start-iap-tunnel) "), case


def test_fabric_through_the_iap_stand_in_rejects_unknown_keys(vm_pod, ends, tmp_path) -> None:
    names = instance_names(vm_pod)

    def connect(name: str, known_hosts: Path, banner_timeout: float = 15) -> fabric.Connection:
        conn = fabric.Connection(
            name,
            user=ends["ssh"]["user"],
            gateway=proxy_command(ends),  # Fabric expands %h as ssh_config does
            connect_timeout=15,
            connect_kwargs={
                "key_filename": ends["ssh"]["key_file"],
                "look_for_keys": False,
                "allow_agent": False,
                "banner_timeout": banner_timeout,
            },
        )
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        conn.client.load_host_keys(str(known_hosts))
        return conn

    with connect(names[1], Path(ends["ssh"]["known_hosts"])) as conn:
        done = conn.run("echo $USER", hide=True, in_stream=False)
        assert done.stdout == f"{ends['ssh']['user']}\n"
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    refused = pytest.raises(paramiko.SSHException, match="not found in known_hosts")
    with connect(names[1], empty) as conn, refused:
        conn.open()
    # The TPU node's name is no instance: the stand-in refuses it and no SSH banner ever comes
    # (paramiko's ProxyCommand notices only at its banner timeout).
    unknown = pytest.raises(paramiko.SSHException, match="banner")
    with connect(f"{ends['node']}-w-0", Path(ends["ssh"]["known_hosts"]), 2) as conn, unknown:
        conn.open()


def test_google_auth_refreshes_compute_engine_credentials_on_a_worker(vm_pod, ends) -> None:
    """google-auth in a root process on worker 1 (the login cannot run the operator's Python),
    reading the worker's own metadata server through its GCE_METADATA_HOST, and from outside."""
    code = (
        "import os, google.auth.compute_engine as ce, google.auth.transport.requests as r\n"
        "from google.auth.compute_engine import _metadata\n"
        "c = ce.Credentials(); c.refresh(r.Request())\n"
        "project = _metadata.get_project_id(r.Request())\n"
        "print(c.token, c.service_account_email, project, os.environ['GCE_METADATA_HOST'])\n"
    )
    info = vm_pod.describe()
    metadata = f"{info.workers[1].host}:{info.pod['metadata_port']}"
    python = shlex.join([sys.executable, "-W", "ignore", "-c", code])
    on_worker = ssh(ends, info.workers[1].host, f"sudo -n {python}", timeout=60)
    env = {**os.environ, "GCE_METADATA_HOST": metadata}
    argv = [sys.executable, "-W", "ignore", "-c", code]
    outside = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    for done in (on_worker, outside):
        assert done.returncode == 0, done.stderr
        token, email, project, host = done.stdout.split()
        assert email == ends["identities"]["worker-1"]["email"]  # the stack's worker account
        # a token of the pod's, naming that account: every local API takes it as the worker
        assert tokens.verify(tokens.read_key(vm_pod.paths.root), token) == (email, "")
        assert (project, host) == (ends["project"], metadata)
