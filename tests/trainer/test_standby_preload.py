"""The built-in trainer's standby (trainer/tpupod-job.yaml, `standby.preload`) imports what a
start imports before its first step, so a promoted standby spends none of a restart importing:
after the preload, the trainer's modules and a gs:// workdir's filesystem (what the start's
workdir check opens) import no module of the packages that cost it. Control: the list without gcsfs left
the start ~0.75 s of imports (google-auth, google-cloud-storage, aiohttp)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# the packages a gs:// start pulled in after the earlier list (the frameworks themselves are in it)
HEAVY = ("gcsfs", "google", "aiohttp", "tensorboardX", "requests", "cryptography", "yarl")
PROBE = """
import importlib, json, sys
for name in sys.argv[1].split(","):
    importlib.import_module(name)
before = set(sys.modules)
import fsspec
fsspec.get_filesystem_class("gs")
import trainer.train, trainer.metrics, trainer.storage
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def imported_after(preload: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, ",".join(preload)], cwd=REPO, text=True,
                         capture_output=True, timeout=120, env={"JAX_PLATFORMS": "cpu",
                         "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    new = json.loads(out.stdout.strip().splitlines()[-1])
    return [m for m in new if m.split(".")[0] in HEAVY]


def test_after_the_preload_a_start_imports_nothing_heavy():
    job = yaml.safe_load((REPO / "trainer" / "tpupod-job.yaml").read_text())
    preload = job["standby"]["preload"]
    assert imported_after(preload) == []
    without = [m for m in preload if not m.startswith("gcsfs")]
    assert any(m.startswith("gcsfs") for m in imported_after(without))  # the control
