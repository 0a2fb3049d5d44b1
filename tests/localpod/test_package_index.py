"""`tpupod local package-index`: what a worker booted after it can reach (issue 37)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from localpod.pod import LocalPod
from localpod.vm.environment import registry_unreachable_env
from ops.cli import main


def test_the_switch_is_kept_per_pod_and_shown(tmp_path, capsys):
    cli = ["local", "package-index", "--pod-dir", str(tmp_path / "pod")]
    assert main([*cli, "unreachable"]) == 0
    assert "unreachable for workers booted from now on" in capsys.readouterr().out
    assert LocalPod(tmp_path / "pod").paths.registry_unreachable.exists()
    assert main(cli) == 0 and "unreachable" in capsys.readouterr().out
    assert main([*cli, "reachable"]) == 0
    assert "indexes: reachable" in capsys.readouterr().out
    assert not LocalPod(tmp_path / "pod").paths.registry_unreachable.exists()
    with pytest.raises(SystemExit) as refused:  # argparse: one usage line, exit 2
        main([*cli, "sideways"])
    assert refused.value.code == 2


def test_https_is_refused_and_the_pods_own_addresses_go_direct():
    env = registry_unreachable_env(["127.0.9.1", "127.0.9.2"])
    assert env["NO_PROXY"].split(",") == ["127.0.0.1", "localhost", "127.0.9.1", "127.0.9.2"]
    probe = "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/', timeout=5)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode != 0 and "Connection refused" in out.stderr, out.stderr[-500:]
