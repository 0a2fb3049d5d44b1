"""Where a boot keeps its environments (startup.sh's env_home): the VM's memory when it is a
filesystem that runs executables and has room, else the disk under $TPUPOD_ROOT, and never
memory when the operator says so. The function itself, run by bash from the script's text."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from infra.bundle_archive import PROJECT_ROOT


def env_home(tmp_path: Path, **env: str) -> str:
    script = (PROJECT_ROOT / "bootstrap" / "startup.sh").read_text()
    functions = "".join(re.findall(r"^(?:env_home|ours_alone)\(\) \{\n.*?^\}\n", script,
                                   re.S | re.M))  # fmt: skip
    base = {"PATH": "/usr/bin:/bin", "TPUPOD_ROOT": str(tmp_path / "root"),
            "TPUPOD_RAM_DIR": str(tmp_path / "ram"), "TPUPOD_RAM_MIN_FREE_MB": "1"}  # fmt: skip
    done = subprocess.run(["bash", "-c", f"set -euo pipefail\n{functions}env_home"],
                          env={**base, **env}, capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()


def test_memory_when_it_has_room(tmp_path: Path) -> None:
    assert env_home(tmp_path) == str(tmp_path / "ram")
    assert (tmp_path / "ram").is_dir()


@pytest.mark.parametrize(
    "env",
    [
        {"TPUPOD_ENV_IN_RAM": "0"},  # the operator's choice
        {"TPUPOD_RAM_MIN_FREE_MB": str(1 << 40)},  # no room
        {"TPUPOD_RAM_DIR": "/proc/1/no-such-dir"},  # cannot be made
    ],
    ids=["off", "no-room", "not-writable"],
)
def test_the_disk_otherwise(tmp_path: Path, env: dict) -> None:
    assert env_home(tmp_path, **env) == str(tmp_path / "root")


def test_a_directory_someone_else_could_write_or_a_link_is_not_used(tmp_path: Path) -> None:
    """/dev/shm is every user's: a planted directory must not receive the job's code."""
    planted = tmp_path / "ram"
    planted.mkdir()
    planted.chmod(0o777)
    assert env_home(tmp_path) == str(tmp_path / "root")
    planted.chmod(0o755)
    assert env_home(tmp_path) == str(planted)
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    assert env_home(tmp_path, TPUPOD_RAM_DIR=str(link)) == str(tmp_path / "root")


def test_a_filesystem_that_runs_no_executables_is_not_used(tmp_path: Path) -> None:
    """A venv's extension modules are mapped executable: a noexec tmpfs would fail every import.
    (findmnt stands in for a noexec mount: this machine's /dev/shm allows executables.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "findmnt").write_text("#!/bin/sh\necho rw,nosuid,nodev,noexec,relatime\n")
    (bin_dir / "findmnt").chmod(0o755)
    assert env_home(tmp_path, PATH=f"{bin_dir}:/usr/bin:/bin") == str(tmp_path / "root")
    (bin_dir / "findmnt").write_text("#!/bin/sh\necho rw,nosuid,nodev,relatime\n")
    assert env_home(tmp_path, PATH=f"{bin_dir}:/usr/bin:/bin") == str(tmp_path / "ram")


def sourced(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    """startup.sh's helpers and phases without its main, sourced as the watcher VM's bootstrap
    sources them (bootstrap/watcher-startup.sh), then `body`."""
    script = PROJECT_ROOT / "bootstrap" / "startup.sh"
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TPUPOD_ROOT": str(tmp_path / "root")}
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n. <(sed '$d' {script})\n{body}"],
        env={**base, **env}, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_the_watcher_which_never_runs_main_keeps_its_environment_on_its_disk(tmp_path: Path):
    """The watcher VM sources the phases and runs phase_sync itself (watcher-startup.sh, its
    GCP branch), without main: under set -u it must find everything the phase reads. uv and
    the bucket are stand-ins here; the phase's own code runs."""
    sha = "a" * 64
    bundle = tmp_path / "root" / "bundles" / sha
    bundle.mkdir(parents=True)
    stand_ins = (
        'uv() { echo /usr/bin/python3; }\n'
        'envcache() { echo k1; }\n'
        'env_from_bucket() { mkdir -p "$UV_PROJECT_ENVIRONMENT/bin"; }\n'
    )  # fmt: skip
    done = sourced(tmp_path, f"{stand_ins}mkdir -p $TPUPOD_ROOT/.bootstrap\nphase_sync",
                   MD_BUNDLE_SHA256=sha, MD_UV_GROUP="ops",
                   BOOTSTRAP_STATE=str(tmp_path / "root" / ".bootstrap"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    venv = tmp_path / "root" / "venvs" / sha  # on the disk, not in memory
    assert (bundle / ".venv").resolve() == venv
    assert (venv / ".tpupod-env-key").read_text() == "k1\n"


def test_pruning_keeps_what_a_kept_environment_needs(tmp_path: Path) -> None:
    """The uv caches of this boot's environments and of the kept bundles' venvs stay (a rollback
    installs offline from them), the chosen job environment stays; the rest goes."""
    root, home, state = tmp_path / "root", tmp_path / "ram", tmp_path / "root" / ".bootstrap"
    state.mkdir(parents=True)
    for bundle, key in (("aaa", "k1"), ("bbb", "k2")):
        venv = home / "venvs" / bundle
        venv.mkdir(parents=True)
        (venv / ".tpupod-env-key").write_text(f"{key}\n")
        (root / "bundles" / bundle).mkdir(parents=True)
        (root / "bundles" / bundle / ".venv").symlink_to(venv)
    for key in ("k1", "k2", "k3", "k4"):
        (home / "uv" / f"env-{key}").mkdir(parents=True)
    (home / "uv" / ".envcache.cut-short").mkdir()
    (state / "env-keys").write_text("k4\n")
    for name in ("uv-111", "uv-222"):
        (home / "envs" / name).mkdir(parents=True)
    (root / "job.venv").write_text(f"{home / 'envs' / 'uv-111'}\n")
    done = sourced(tmp_path, "prune_environments", TPUPOD_ENV_HOME=str(home),
                   BOOTSTRAP_STATE=str(state))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (home / "uv").iterdir()) == ["env-k1", "env-k2", "env-k4"]
    assert sorted(p.name for p in (home / "envs").iterdir()) == ["uv-111"]
    assert sorted(p.name for p in (home / "venvs").iterdir()) == ["aaa", "bbb"]


def test_an_old_bundle_takes_its_own_venv_and_nothing_a_link_names_elsewhere(tmp_path: Path):
    """clear-stale removes bundles past the newest two with their venvs, following each .venv
    link only into a venvs/ directory of the environments: it runs as root, and a link naming
    anything else must not turn into an `rm -rf` of it."""
    root, home = tmp_path / "root", tmp_path / "ram"
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "kept.txt").write_text("not a venv")
    current = "c" * 64
    names = [current, "3" * 64, "2" * 64, "1" * 64, "0" * 64]  # newest first
    for name in names:
        bundle = root / "bundles" / name
        (bundle / "bootstrap").mkdir(parents=True)
    ctl = root / "bundles" / current / "bootstrap" / "jobctl.sh"
    ctl.write_text('#!/bin/sh\n[ "$1" = bundle ] && exit 1; exit 0\n')  # no job running
    ctl.chmod(0o755)
    (home / "venvs" / names[3]).mkdir(parents=True)
    (root / "bundles" / names[3] / ".venv").symlink_to(home / "venvs" / names[3])
    (root / "bundles" / names[4] / ".venv").symlink_to(precious)
    for age, name in enumerate(names):  # last: making the links touched the directories
        os.utime(root / "bundles" / name, (1e9 - age, 1e9 - age))
    state = root / ".bootstrap"
    state.mkdir()
    done = sourced(tmp_path, "phase_clear_stale", TPUPOD_ENV_HOME=str(home),
                   TPUPOD_RAM_DIR=str(home), MD_BUNDLE_SHA256=current,
                   BOOTSTRAP_STATE=str(state))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (root / "bundles").iterdir()) == sorted(names[:3])
    assert not (home / "venvs" / names[3]).exists()  # its own venv went with it
    assert (precious / "kept.txt").exists()  # what a link named elsewhere stayed


def test_a_boot_in_the_other_place_frees_what_an_earlier_one_left(tmp_path: Path) -> None:
    """Memory was used, then full (or the reverse): the place this boot did not choose keeps only
    what a kept bundle's venv there needs; a directory of memory someone else could write is
    never entered."""
    root, ram, state = tmp_path / "root", tmp_path / "ram", tmp_path / "root" / ".bootstrap"
    state.mkdir(parents=True)

    def venv(home: Path, bundle: str, key: str, linked: bool = True) -> None:
        (home / "venvs" / bundle).mkdir(parents=True, exist_ok=True)
        (home / "venvs" / bundle / ".tpupod-env-key").write_text(f"{key}\n")
        (home / "uv" / f"env-{key}").mkdir(parents=True, exist_ok=True)
        if linked:
            (root / "bundles" / bundle).mkdir(parents=True, exist_ok=True)
            (root / "bundles" / bundle / ".venv").unlink(missing_ok=True)
            (root / "bundles" / bundle / ".venv").symlink_to(home / "venvs" / bundle)

    def names(path: Path) -> list[str]:
        return sorted(p.name for p in path.iterdir()) if path.exists() else []

    venv(ram, "old", "k0")  # a kept bundle's venv, in memory by an earlier boot
    venv(ram, "new", "k1", linked=False)  # this bundle's, in memory by an earlier boot
    (ram / "envs" / "uv-111").mkdir(parents=True)
    venv(root, "new", "k1")  # this boot, on the disk
    (root / "envs" / "uv-111").mkdir(parents=True)
    (root / "job.venv").write_text(f"{root / 'envs' / 'uv-111'}\n")
    (state / "env-keys").write_text("k1\n")
    ram.chmod(0o755)
    done = sourced(tmp_path, "prune_environments", TPUPOD_ENV_HOME=str(root),
                   TPUPOD_RAM_DIR=str(ram), BOOTSTRAP_STATE=str(state))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert names(ram / "venvs") == ["old"] and names(ram / "uv") == ["env-k0"]
    assert names(ram / "envs") == []
    assert (names(root / "venvs"), names(root / "uv"), names(root / "envs")) == (
        ["new"], ["env-k1"], ["uv-111"])  # fmt: skip

    # The reverse: this boot in memory, an orphan venv and its cache on the disk.
    venv(root, "gone", "k9", linked=False)
    done = sourced(tmp_path, "prune_environments", TPUPOD_ENV_HOME=str(ram),
                   TPUPOD_RAM_DIR=str(ram), BOOTSTRAP_STATE=str(state))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert names(root / "venvs") == ["new"] and "env-k9" not in names(root / "uv")

    # A memory directory another user could write is not ours to clear.
    venv(ram, "planted", "k7", linked=False)
    ram.chmod(0o777)
    done = sourced(tmp_path, "prune_environments", TPUPOD_ENV_HOME=str(root),
                   TPUPOD_RAM_DIR=str(ram), BOOTSTRAP_STATE=str(state))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "planted" in names(ram / "venvs") and "env-k7" in names(ram / "uv")
    ram.chmod(0o755)
