"""README's "Your weights without tpupod": its Python block, run verbatim against a checkpoint
the trainer wrote to the GCS emulator with the environment the README names, restores params
whose sha256 is the trainer's own params fingerprint."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from trainer_testlib import REPO, run_ok, summary

# Appended after the README's code: the trainer's fingerprint (sha256 over every leaf in tree
# order), computed from the numpy arrays the README code restored.
CHECK = """
import hashlib
digest = hashlib.sha256()
for leaf in jax.tree.leaves(params):
    digest.update(np.ascontiguousarray(leaf).tobytes())
print("STEP", step, "FINGERPRINT", digest.hexdigest())
"""


def readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


@pytest.mark.slow  # the README snippet, unchanged by recovery work; CI stays under 20 minutes
def test_readme_restores_params_with_plain_orbax(spawn, tmp_path, gcs_emulator):
    section = readme_section("Your weights without tpupod")
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exports = re.search(r"```bash\nexport (.*?)```", section, re.S).group(1)
    names = set(re.findall(r"([A-Z_]+)=", exports))
    assert names <= set(gcs_emulator) | {"WORKDIR"}, names  # the README names what we set

    wd = "gs://tpupod-test/runs/readme"
    run_ok(spawn, ["--config", "tiny", "--steps", 6, "--workdir", wd], tmp_path, "train",
           env=gcs_emulator)  # fmt: skip
    env = {**gcs_emulator, "WORKDIR": wd, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code + CHECK], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    expected = f"STEP 6 FINGERPRINT {summary(wd)['params_fingerprint']}"
    assert expected in out.stdout, out.stdout[-2000:]
