"""The scripts themselves: shellcheck clean (the end-to-end runs are in test_localpod_boot)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from infra.bundle_archive import PROJECT_ROOT


def test_shellcheck_clean():
    scripts = sorted(str(p) for p in (PROJECT_ROOT / "bootstrap").glob("*.sh"))
    assert len(scripts) >= 2
    shellcheck = PROJECT_ROOT / ".venv" / "bin" / "shellcheck"
    result = subprocess.run([str(shellcheck), *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


UNIT = PROJECT_ROOT / "bootstrap" / "tpupod-job@.service"
HARDENING = {
    "NoNewPrivileges": "yes",
    "RestrictSUIDSGID": "yes",
    "ProtectSystem": "full",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "LockPersonality": "yes",
}
# Each would cut the trainer off its TPU, libtpu's lockfile or its Python (see the unit).
LEFT_OUT = ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "PrivateTmp",
            "ProtectHome", "MemoryDenyWriteExecute")  # fmt: skip


def rendered_unit(tmp_path) -> Path:
    """As jobctl.sh's install_unit writes it."""
    text = UNIT.read_text().replace("@TPUPOD_ROOT@", "/var/lib/tpupod")
    path = tmp_path / UNIT.name
    path.write_text(text.replace("@STOP_TIMEOUT@", "90"))
    return path


def test_unit_is_hardened_without_touching_devices(tmp_path):
    settings = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings[key.strip()] = value.strip()
    assert {k: settings.get(k) for k in HARDENING} == HARDENING
    assert [k for k in LEFT_OUT if k in settings] == []
    comments = "\n".join(line for line in UNIT.read_text().splitlines() if line.startswith("#"))
    assert [k for k in LEFT_OUT if k not in comments] == []  # each one left out says why


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_unit_parses_cleanly(tmp_path):
    """systemd's own parser: no unknown key or bad value (it warns and goes on, exit 0)."""
    unit = rendered_unit(tmp_path)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert [line for line in result.stderr.splitlines() if unit.name in line] == []
