"""A systemd manager of a test's own: `systemd --user` in a mount namespace of its own, where
/run/systemd/system exists (systemd runs only where it booted, and jobctl.sh asks the same
question). jobctl reaches it with TPUPOD_SYSTEMD_SCOPE=user from inside that namespace (nsenter):
the same template, instances, cgroups, KillMode and hardening as on a GCP worker, with the unit
in the manager's own directory instead of /etc. Needs root, util-linux and systemd."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

NEEDS = ("systemd", "systemctl", "unshare", "nsenter")


def missing() -> str | None:
    if os.geteuid() != 0:
        return "a mount namespace of its own needs root"
    lacking = [tool for tool in NEEDS if shutil.which(tool) is None]
    return f"no {', '.join(lacking)}" if lacking else None


class UserSystemd:
    """One manager; `env` is what a caller of jobctl adds, `run` runs a command inside."""

    def __init__(self, base: Path):
        self.runtime, self.config = base / "run", base / "config"
        self.runtime.mkdir(mode=0o700, parents=True)
        (self.config / "systemd" / "user").mkdir(parents=True)
        self.env = {"XDG_RUNTIME_DIR": str(self.runtime), "XDG_CONFIG_HOME": str(self.config),
                    "TPUPOD_SYSTEMD_SCOPE": "user"}  # fmt: skip
        # What the manager (so every unit) starts with: a machine's usual few.
        manager_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                       "HOME": str(base), "LANG": "C.UTF-8", **self.env}  # fmt: skip
        script = ("mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && "
                  "exec systemd --user --log-target=console")  # fmt: skip
        with open(base / "systemd.log", "wb") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                env=manager_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while self.run("systemctl", "--user", "is-system-running").stdout.strip() not in (
            "running",
            "degraded",
        ):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                pytest.fail(f"systemd --user did not start: {(base / 'systemd.log').read_text()}")
            time.sleep(0.1)

    def run(self, *argv: str, env: dict | None = None, timeout: float = 60):
        """argv in the manager's mount namespace (the pid is unshare's, then systemd's)."""
        return subprocess.run(
            ["nsenter", "-t", str(self.proc.pid), "-m", "--", *argv],
            env={**(env or {"PATH": os.environ["PATH"]}), **self.env},
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def unsupported(self, unit: Path) -> list[str]:
        """The [Service] settings of `unit` this machine's systemd cannot apply to a unit (each
        tried alone on /bin/true: some sandboxes refuse the /proc and /sys remounts that
        ProtectKernelTunables and ProtectKernelLogs make, 226/NAMESPACE)."""
        section, refused = None, []
        settings = []
        for line in unit.read_text().splitlines():
            if line.startswith("["):
                section = line
            elif section == "[Service]" and "=" in line and not line.startswith("#"):
                settings.append(line)
        user_dir = self.config / "systemd" / "user"
        for i, setting in enumerate(s for s in settings if not s.startswith(("Exec", "Type"))):
            (user_dir / f"probe{i}.service").write_text(
                f"[Service]\nType=oneshot\nExecStart=/bin/true\n{setting}\n"
            )
            self.run("systemctl", "--user", "daemon-reload")
            if self.run("systemctl", "--user", "start", f"probe{i}.service").returncode:
                refused.append(setting)
            (user_dir / f"probe{i}.service").unlink()
        self.run("systemctl", "--user", "daemon-reload")
        return refused

    def invocation(self, unit: str) -> str:
        """The unit's INVOCATION_ID, which systemd gives each of its processes."""
        return self.run("systemctl", "--user", "show", "-p", "InvocationID", "--value",
                        unit).stdout.strip()  # fmt: skip

    def units(self) -> list[str]:
        """Our instances loaded now (an ended one is collected)."""
        out = self.run("systemctl", "--user", "list-units", "--all", "--plain", "--no-legend",
                       "tpupod-job@*").stdout  # fmt: skip
        return sorted(line.split()[0] for line in out.splitlines() if line.strip())

    def close(self) -> None:
        """Its units stopped first (their processes are the manager's children), then it."""
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.run("systemctl", "--user", "stop", "tpupod-job@*", timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def unit_of(pid: int) -> str:
    """The tpupod-job instance process `pid` runs in, from its cgroup ('' if none)."""
    found = re.search(r"tpupod-job@[^/\s]*\.service", Path(f"/proc/{pid}/cgroup").read_text())
    return found.group(0) if found else ""
