"""The real startup.sh on a two-worker slice: metadata server, bucket emulator, real trainers.

The tests of this module share one slice and run in order: boot from nothing, re-run, new bundle.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from infra.bundle_archive import PROJECT_ROOT
from localpod import procs

PHASES = ["metadata", "uv", "bundle", "sync", "clear-stale", "trainer-env", "start-trainer"]


def phase_lines(log: str, phase: str) -> list[str]:
    return [line for line in log.splitlines() if f" [{phase}] " in line]


def trainer_processes(root: Path) -> list[int]:
    """Live `python -m trainer` processes running from one of this worker's bundles."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if b"-m" in cmdline and b"trainer" in cmdline and cwd.startswith(str(root / "bundles")):
            found.append(int(entry))
    return found


def test_shellcheck_clean():
    scripts = sorted(str(p) for p in (PROJECT_ROOT / "bootstrap").glob("*.sh"))
    shellcheck = PROJECT_ROOT / ".venv" / "bin" / "shellcheck"
    result = subprocess.run([str(shellcheck), *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_boot_from_nothing_to_training(pod, bundles):
    pod.publish(bundles[0])
    for result in pod.boot():
        assert result.returncode == 0, result.output
    statuses = pod.wait_training([0, 1])
    sha = bundles[0].sha256
    for i in (0, 1):
        boot = pod.bootstrap(i)
        assert boot["state"] == "ok" and boot["bundle_sha256"] == sha
        assert [p["name"] for p in boot["phases"]] == PHASES
        assert all(p["state"] == "ok" and p["seconds"] >= 0 for p in boot["phases"])
        root = pod.root(i)
        assert os.readlink(root / "current") == f"bundles/{sha}"
        assert (root / "bundles" / sha / ".venv" / "bin" / "python").exists()
        env = dict(line.split("=", 1) for line in (root / "trainer.env").read_text().splitlines())
        assert (
            env["TPUPOD_COORDINATOR"]
            == f"{pod.addresses[0]}:{pod.attributes[0]['tpupod-coordinator-port']}"
        )
        assert env["TPUPOD_NUM_PROCESSES"] == "2" and env["TPUPOD_PROCESS_ID"] == str(i)
        assert env["TPUPOD_WORKDIR"] == "gs://tpupod-local-ckpt/runs/local"
        assert env["TPUPOD_STATUS_FILE"] == str(root / "status.json")
        assert statuses[i]["process_id"] == i
        log = (root / "bootstrap.log").read_text()
        assert all(phase_lines(log, name) for name in PHASES)
        assert len(trainer_processes(root)) == 1


def test_rerun_reinstalls_nothing_and_keeps_one_trainer(pod, bundles):
    sha = bundles[0].sha256
    pids = [pod.trainer_pid(i) for i in (0, 1)]
    assert all(pids), "the previous test left no trainers"
    logs_before = [len((pod.root(i) / "bootstrap.log").read_text()) for i in (0, 1)]
    steps = [pod.status(i)["step"] for i in (0, 1)]
    for result in pod.boot():
        assert result.returncode == 0, result.output
    for i in (0, 1):
        root = pod.root(i)
        log = (root / "bootstrap.log").read_text()[logs_before[i] :]
        assert any("already present" in line for line in phase_lines(log, "bundle"))
        sync = "\n".join(phase_lines(log, "sync"))
        assert "Installed" not in sync and "Uninstalled" not in sync, sync
        assert any("already running" in line for line in phase_lines(log, "start-trainer"))
        assert pod.trainer_pid(i) == pids[i]
        assert trainer_processes(root) and len(trainer_processes(root)) == 1
        assert [p.name for p in (root / "bundles").iterdir() if not p.name.startswith(".")] == [sha]
        assert pod.bootstrap(i)["state"] == "ok"
    # The same trainers go on training.
    pod.wait_training([0, 1], after_step=min(steps))


def test_new_bundle_hash_fetches_and_restarts(pod, bundles):
    old, new = bundles[0].sha256, bundles[1].sha256
    old_pids = [pod.trainer_pid(i) for i in (0, 1)]
    assert all(old_pids), "the previous test left no trainers"
    for i in (0, 1):  # a stale libtpu lock from the old trainer's time
        (pod.root(i) / "libtpu_lockfile").write_text("")
    pod.publish(bundles[1])
    for result in pod.boot():
        assert result.returncode == 0, result.output
    for i in (0, 1):
        root = pod.root(i)
        assert os.readlink(root / "current") == f"bundles/{new}"
        assert (root / "bundles" / new / ".tpupod-bundle").read_text().strip() == new
        assert pod.bootstrap(i)["bundle_sha256"] == new
        log = (root / "bootstrap.log").read_text()
        assert any(
            f"runs bundle {old}, want {new}" in line for line in phase_lines(log, "clear-stale")
        )
        assert not (root / "libtpu_lockfile").exists()
        assert pod.trainer_pid(i) not in (None, old_pids[i])
        assert not procs.alive(old_pids[i])
        # Exit 75 once its preemption save commits; SIGKILL (137) after the stop timeout if not.
        assert any("trainer stopped (exit code" in line for line in phase_lines(log, "clear-stale"))
    statuses = pod.wait_training([0, 1])
    for i in (0, 1):
        assert trainer_processes(pod.root(i)) == [
            p for p in trainer_processes(pod.root(i)) if os.readlink(f"/proc/{p}/cwd").endswith(new)
        ]
        assert len(trainer_processes(pod.root(i))) == 1
        # The restarted job resumes from the checkpoint its predecessor saved on SIGTERM.
        assert statuses[i].get("restored_from") is not None, statuses[i]
