"""The standby under systemd (GCP's workers), against a real systemd manager (user_systemd.py):
a cold start runs in an instance `run-ID` of tpupod-job@.service, the job's first progress
parks its next attempt in an instance of its own (`standby-ID`: the stop of the job's instance
leaves it), a restart's stop keeps it and the start promotes it in place, and the next standby
parks in yet another instance. Each launch's environment is the manager's, never the caller's:
a caller with another LANG (an SSH client's, forwarded) still promotes it; the control is the
manager's own LANG changed after it parked, which a cold start would get: refused, cold."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from infra.bundle_archive import PROJECT_ROOT
from tests.bootstrap.test_jobctl import Ctl
from tests.bootstrap.test_standby_jobctl import attempts, await_standby, records, standby_ctl
from tests.bootstrap.user_systemd import UserSystemd, missing, unit_of

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


class SystemdCtl(Ctl):
    """jobctl.sh run inside the manager's namespace, as ops runs it over SSH (as root)."""

    def __init__(self, root, manager: UserSystemd):
        super().__init__(root)
        self.manager = manager
        # The product's unit, less what this machine's systemd cannot apply (named in the log).
        unit = PROJECT_ROOT / "bootstrap" / "tpupod-job@.service"
        refused = manager.unsupported(unit)
        print(f"left out of the unit here (this machine's systemd refuses them): {refused}")
        # What `systemctl start` and show-environment run under, from inside the job's unit.
        assert not {"NoNewPrivileges=yes", "ProtectSystem=full", "RestrictNamespaces=yes"} & set(
            refused
        )
        kept = [line for line in unit.read_text().splitlines() if line not in refused]
        (root / "current" / "bootstrap" / unit.name).write_text("\n".join(kept) + "\n")

    def __call__(self, verb, stop_timeout=10, **extra):
        env = {**extra, "PATH": os.environ["PATH"], "TPUPOD_ROOT": str(self.root),
               "TPUPOD_STOP_TIMEOUT": str(stop_timeout),
               "TPUPOD_LIBTPU_LOCKFILE": str(self.lock)}  # fmt: skip
        jobctl = str(self.root / "current" / "bootstrap" / "jobctl.sh")
        return self.manager.run("bash", jobctl, verb, env=env)


@pytest.fixture
def ctl(tmp_path):
    """One manager per test; after it, its units are stopped, it ends, and any process left
    running from one of our roots is killed by its pid."""
    manager = UserSystemd(tmp_path / "systemd")
    made = []

    def make():
        made.append(SystemdCtl(tmp_path / f"root{len(made)}", manager))
        return made[-1]

    make.manager = manager
    yield make
    manager.close()
    ours = str(tmp_path.resolve())
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/cwd").startswith(ours):
                os.kill(int(entry), signal.SIGKILL)


def test_a_restart_promotes_the_standby_in_its_own_unit(ctl):
    c = standby_ctl(ctl)
    manager = ctl.manager
    first = c("start", TPUPOD_ATTEMPT="1")
    assert first.returncode == 0, (first.stdout, first.stderr)
    cold_unit = unit_of(c.pid())
    assert cold_unit.startswith("tpupod-job@run-"), cold_unit
    cold_id = manager.invocation(cold_unit)
    standby = await_standby(c)
    parked_unit = unit_of(standby["pid"])
    assert (
        parked_unit.startswith("tpupod-job@standby-") and unit_of(standby["child"]) == parked_unit
    )
    assert manager.units() == sorted([cold_unit, parked_unit])
    parked_id = manager.invocation(parked_unit)
    assert c("stop", TPUPOD_KEEP_STANDBY="1").returncode == 0
    assert manager.units() == [parked_unit]  # the job's instance is gone, the parked one stays
    started = c("start", TPUPOD_ATTEMPT="2", LANG="de_DE.UTF-8")  # the caller's own locale
    assert started.returncode == 0 and "the standby" in started.stdout, started.stderr
    assert c.pid() == standby["pid"] and unit_of(c.pid()) == parked_unit
    cold_run, promoted = attempts(c, 2)
    assert cold_run["attempt"] == "1" and not cold_run["preloaded"]
    assert promoted["pid"] == standby["child"] and promoted["attempt"] == "2"
    assert promoted["preloaded"] and promoted["argv"] == ["--x", "1"]
    # Each job carries the mark of the unit it runs in (the journal echo follows it), never
    # its caller's (the promoting `jobctl start` is in no unit).
    assert (cold_run["unit"], promoted["unit"]) == (cold_id, parked_id) and cold_id != parked_id
    c.wait_for("step 3")
    nxt = await_standby(c)  # the promoted job's progress parks the next one, elsewhere
    assert unit_of(nxt["pid"]) not in ("", cold_unit, parked_unit)
    stopped = c("stop")  # not a restart: the parked one goes too
    assert stopped.returncode == 0 and (c.root / "job.exit").read_text().strip() == "75"
    assert manager.units() == [] and not (c.root / "standby.json").exists()


def test_the_managers_environment_changed_since_parking_is_refused(ctl):
    c = standby_ctl(ctl)
    assert c("start", TPUPOD_ATTEMPT="1").returncode == 0
    standby = await_standby(c)
    assert c("stop", TPUPOD_KEEP_STANDBY="1").returncode == 0
    changed = ctl.manager.run("systemctl", "--user", "set-environment", "LANG=C")
    assert changed.returncode == 0, changed.stderr
    started = c("start", TPUPOD_ATTEMPT="2")
    assert started.returncode == 0, started.stderr
    assert "standby refused: the environment differs in LANG" in started.stderr
    assert c.pid() != standby["pid"] and unit_of(c.pid()).startswith("tpupod-job@run-")
    attempts(c, 2)
    assert records(c)[1]["preloaded"] is False and records(c)[1]["attempt"] == "2"
    assert c("stop").returncode == 0


def test_a_local_pod_worker_never_uses_its_hosts_systemd(ctl):
    """TPUPOD_NO_SYSTEMD (every local pod worker's environment): sessions, no units, no unit
    file, where systemd runs; the control is the first test, the same calls without it."""
    c = standby_ctl(ctl)
    assert c("start", TPUPOD_ATTEMPT="1", TPUPOD_NO_SYSTEMD="1").returncode == 0
    standby = await_standby(c)  # parked by the launcher's own `jobctl standby`
    assert unit_of(c.pid()) == unit_of(standby["pid"]) == "" and ctl.manager.units() == []
    assert not (ctl.manager.config / "systemd" / "user" / "tpupod-job@.service").exists()
    assert c("stop", TPUPOD_NO_SYSTEMD="1").returncode == 0
    assert not (c.root / "standby.json").exists()


def test_a_stop_ends_a_standby_still_starting(ctl):
    """`jobctl standby` returns once its unit started, before the parked launcher says so in
    standby.json: a plain stop then still ends it (every instance of ours), and a stop that
    keeps the standby ends the job's instance alone."""
    c = standby_ctl(ctl)
    assert c("start", TPUPOD_ATTEMPT="1").returncode == 0
    await_standby(c)
    assert c("stop").returncode == 0 and ctl.manager.units() == []  # the template stays
    assert c("standby").returncode == 0
    assert c("stop").returncode == 0
    assert ctl.manager.units() == [] and not (c.root / "standby.json").exists()
