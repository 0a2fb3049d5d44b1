"""The gcp provider against a table-driven double of gcloud and the Pulumi CLI (no emulator
exists for either); the state table and the watch loop above it are the real ones."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ops.cli import CliError
from ops.journal import Journal
from ops.provider import ProviderError, SliceState
from ops.providers import ROOT, get_provider, known_stacks
from ops.providers.gcp import GcpProvider, subprocess_runner
from ops.recovery import SLICE_ACTIONS, Action, Limits, SliceAction, decide
from ops.watch import WatchConfig, Watcher

URN = "urn:pulumi:v4-32::tpupod::tpupod:infra:TpuSlice$gcp:tpu/v2Vm:V2Vm::tpupod-v4-32"
OUTPUTS = {
    "tpu_urn": URN,
    "tpu_name": "tpupod-v4-32",
    "zone": "us-central2-b",
    "project": "proj",
    "worker_internal_ips": ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"],
}
NOT_FOUND = "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource was not found"


class FakeCli:
    """argv prefix -> (exit code, stdout, stderr); records every call with its cwd."""

    def __init__(self, node_state: str | None):
        self.calls: list[tuple[list[str], Path]] = []
        node = {"state": node_state, "health": "HEALTHY", "networkEndpoints": []}
        self.table = {
            ("pulumi", "stack", "output"): (0, json.dumps(OUTPUTS), ""),
            ("pulumi", "up"): (0, "Resources: 1 replaced", ""),
            ("gcloud", "compute", "tpus", "tpu-vm", "describe"): (
                (1, "", NOT_FOUND) if node_state is None else (0, json.dumps(node), "")
            ),
            ("gcloud", "compute", "tpus", "tpu-vm", "delete"): (0, "", ""),
        }

    def __call__(self, argv, cwd):
        self.calls.append((list(argv), cwd))
        for prefix, (code, out, err) in self.table.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return subprocess.CompletedProcess(list(argv), code, out, err)
        raise AssertionError(f"unexpected command {argv}")

    def verbs(self):
        return [" ".join(argv[:5]) for argv, _ in self.calls]


# Every TPU node state the API documents, a missing node and a value from the future.
STATE_TABLE = [
    ("CREATING", SliceState.CREATING, Action.WAIT),
    ("READY", SliceState.READY, Action.WAIT),  # then the workers decide (none reachable here)
    ("RESTARTING", SliceState.RESTARTING, Action.WAIT),
    ("REPAIRING", SliceState.REPAIRING, Action.WAIT),
    ("STOPPING", SliceState.STOPPING, Action.WAIT),
    ("STOPPED", SliceState.STOPPED, Action.RECREATE),
    ("STARTING", SliceState.STARTING, Action.WAIT),
    ("PREEMPTED", SliceState.PREEMPTED, Action.RECREATE),
    ("TERMINATED", SliceState.TERMINATED, Action.RECREATE),
    ("DELETING", SliceState.DELETING, Action.WAIT),
    (None, SliceState.MISSING, Action.RECREATE),
    ("HIBERNATING_IN_2031", SliceState.UNKNOWN, Action.WAIT),
]


@pytest.mark.parametrize(("raw", "state", "action"), STATE_TABLE)
def test_node_state_to_action(raw, state, action, tmp_path):
    cli = FakeCli(raw)
    provider = GcpProvider("v4-32", ROOT, runner=cli)
    info = provider.describe()
    assert info.state is state
    # READY with no worker probes yet: the table waits for the workers' verdicts
    decision = decide(info.state, [], 0.0, lambda _k: 0.0, Limits(), info.health)
    assert decision.action is action
    if SLICE_ACTIONS[state] is not SliceAction.CHECK_WORKERS:
        assert info.workers == []
    describe = ["gcloud", "compute", "tpus", "tpu-vm", "describe", "tpupod-v4-32"]
    assert cli.calls[-1][0] == [*describe, "--zone", "us-central2-b", "--project", "proj",
                                "--format=json"]  # fmt: skip


# READY hands over to the workers over SSH: the e2e tests on the local pod cover it.
NOT_READY = [row for row in STATE_TABLE if row[1] is not SliceState.READY]


@pytest.mark.parametrize(("raw", "state", "action"), NOT_READY)
def test_one_watch_step_takes_the_action(raw, state, action, tmp_path):
    """The real watch loop over the double: recreate states delete + `pulumi up --replace`."""
    cli = FakeCli(raw)
    provider = GcpProvider("v4-32", ROOT, runner=cli)
    watcher = Watcher(provider, Journal(tmp_path / "j.jsonl"), WatchConfig(ready_deadline=0))
    watcher.step()
    ran_up = any(argv[:2] == ["pulumi", "up"] for argv, _ in cli.calls)
    assert ran_up is (action is Action.RECREATE)


def test_recreate_deletes_then_replaces_the_tpu_urn_from_the_project_root():
    cli = FakeCli("PREEMPTED")
    GcpProvider("v4-32", ROOT, runner=cli).recreate()
    commands = [argv for argv, _ in cli.calls if argv[0] != "pulumi" or argv[1] != "stack"]
    assert commands == [
        ["gcloud", "compute", "tpus", "tpu-vm", "delete", "tpupod-v4-32",
         "--zone", "us-central2-b", "--project", "proj", "--quiet"],
        ["pulumi", "up", "--stack", "v4-32", "--yes", "--replace", URN],
    ]  # fmt: skip
    assert {cwd for _, cwd in cli.calls} == {ROOT}  # the CLI honours stackConfigDir from there


def test_workers_come_from_the_stack_outputs(monkeypatch):
    monkeypatch.setenv("TPUPOD_SSH_USER", "ops")
    workers = GcpProvider("v4-32", ROOT, runner=FakeCli("READY")).describe().workers
    assert [(w.index, w.host, w.port, w.user) for w in workers] == [
        (i, ip, 22, "ops") for i, ip in enumerate(OUTPUTS["worker_internal_ips"])
    ]
    assert all(w.proxy_command is None for w in workers)
    monkeypatch.setenv("TPUPOD_SSH_VIA", "iap")
    workers = GcpProvider("v4-32", ROOT, runner=FakeCli("READY")).describe().workers
    assert "start-iap-tunnel" in workers[1].proxy_command
    assert "--listen-on-stdin" in workers[1].proxy_command


def test_without_the_clis_one_line_says_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    provider = GcpProvider("v4-32", ROOT, runner=subprocess_runner)
    with pytest.raises(ProviderError) as err:
        provider.describe()
    assert "Pulumi CLI is not installed" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ProviderError, match="gcloud is not installed"):
        subprocess_runner(["gcloud", "version"], ROOT)


def test_a_stack_never_deployed_says_what_to_run():
    cli = FakeCli("READY")
    cli.table[("pulumi", "stack", "output")] = (255, "", "error: no stack named 'v4-32' found")
    with pytest.raises(ProviderError, match=r"run `pulumi up --stack v4-32`"):
        GcpProvider("v4-32", ROOT, runner=cli).describe()
    cli.table[("pulumi", "stack", "output")] = (0, "{}", "")
    with pytest.raises(ProviderError, match="has not been deployed"):
        GcpProvider("v4-32", ROOT, runner=cli).describe()


def test_credentials_missing_is_one_line():
    cli = FakeCli("READY")
    cli.table[("gcloud", "compute", "tpus", "tpu-vm", "describe")] = (
        1, "", "ERROR: (gcloud) You do not currently have an active account selected.\n"
        "Please run:\n\n  $ gcloud auth login\n",
    )  # fmt: skip
    with pytest.raises(
        ProviderError, match=r"^gcloud has no credentials: run `gcloud auth login`$"
    ):
        GcpProvider("v4-32", ROOT, runner=cli).describe()


def test_unknown_stack_names_the_existing_ones():
    with pytest.raises(CliError) as err:
        get_provider("v9-9999")
    message = str(err.value)
    assert "local" in message and "pulumi stack init v9-9999" in message
    for stack in known_stacks():
        assert stack in message
