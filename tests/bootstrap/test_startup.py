"""The scripts themselves: shellcheck clean (the end-to-end runs are in test_localpod_boot)."""

from __future__ import annotations

import subprocess

from infra.bundle_archive import PROJECT_ROOT


def test_shellcheck_clean():
    scripts = sorted(str(p) for p in (PROJECT_ROOT / "bootstrap").glob("*.sh"))
    assert len(scripts) >= 2
    shellcheck = PROJECT_ROOT / ".venv" / "bin" / "shellcheck"
    result = subprocess.run([str(shellcheck), *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
