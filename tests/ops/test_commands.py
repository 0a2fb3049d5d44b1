"""The `tpupod` commands' one-line errors, the journal, and an interruptible watch loop."""

from __future__ import annotations

import subprocess
import threading

import pytest

from ops.cli import build_parser, main
from ops.journal import Journal, read
from ops.providers import ROOT
from ops.providers.gcp import GcpProvider
from ops.watch import WatchConfig, Watcher


def test_every_command_is_registered_once():
    names = set(build_parser()._subparsers._group_actions[0].choices)
    assert {"status", "logs", "restart", "watch", "demo", "local"} <= names


@pytest.mark.parametrize("command", ["status", "logs", "restart", "watch"])
def test_unknown_stack_is_one_line_naming_the_stacks(command, capsys):
    assert main([command, "--stack", "v9-9999"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown stack 'v9-9999'" in err and "v4-32" in err
    assert "pulumi up --stack v9-9999" in err


@pytest.mark.parametrize("command", ["status", "watch"])
def test_gcp_stack_without_pulumi_says_what_to_install(command, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main([command, "--stack", "v4-32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "tpupod: the Pulumi CLI is not installed: install it "
        "(curl -fsSL https://get.pulumi.com | sh), then run `pulumi login`"
    )


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
    """Ctrl-C inside a provider call: the loop journals it, closes SSH and re-raises (exit 130
    in `ops.cli.main`)."""
    calls = []

    def interrupted_gcloud(argv, cwd):
        calls.append(argv)
        if argv[0] == "pulumi":
            return subprocess.CompletedProcess(argv, 0, '{"tpu_urn": "u", "tpu_name": "n", '
                                               '"zone": "z", "project": "p"}', "")  # fmt: skip
        raise KeyboardInterrupt

    before = threading.active_count()
    journal = Journal(tmp_path / "j.jsonl")
    watcher = Watcher(GcpProvider("v4-32", ROOT, runner=interrupted_gcloud), journal, WatchConfig())
    with pytest.raises(KeyboardInterrupt):
        watcher.run()
    assert [e["event"] for e in journal.events] == ["watching", "interrupted"]
    assert watcher.group is None and threading.active_count() <= before
