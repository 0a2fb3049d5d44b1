"""The run directory's layout is spelled once in Python (contract.layout): among the product's
Python files (infra/, ops/, trainer/, bootstrap/*.py, contract/, __main__.py) the strings
`checkpoints/` and `attempt-` appear in one module. The worker's shell keeps its literal, checked
here against contract."""

from __future__ import annotations

import re
from pathlib import Path

from contract import layout

REPO = Path(__file__).resolve().parents[2]
SCOPE = ("infra/**/*.py", "ops/**/*.py", "trainer/**/*.py", "bootstrap/*.py", "contract/**/*.py",
         "__main__.py")  # fmt: skip
SPELLINGS = ("checkpoints/", "attempt-")


def modules_spelling(root: Path, text: str) -> list[str]:
    """The modules under `root` (SCOPE) whose source contains `text`, comments and docstrings
    included (a path written in prose is still a second spelling to keep in step)."""
    found = {path for pattern in SCOPE for path in root.glob(pattern) if text in path.read_text()}
    return sorted(str(p.relative_to(root)) for p in found)


def test_each_path_of_the_run_directory_is_spelled_in_one_module():
    for text in SPELLINGS:
        assert modules_spelling(REPO, text) == ["contract/layout.py"], text


def test_the_scan_finds_a_second_spelling(tmp_path):
    """A negative control: a planted copy in an ops module (a docstring too) is found."""
    (tmp_path / "contract").mkdir()
    (tmp_path / "contract" / "layout.py").write_text('X = "checkpoints/"\n')
    (tmp_path / "ops" / "fleet").mkdir(parents=True)
    (tmp_path / "ops" / "fleet" / "m.py").write_text('"""logs in tpupod/attempt-3/"""\n')
    (tmp_path / "bootstrap").mkdir()
    (tmp_path / "bootstrap" / "run.py").write_text('p = f"{d}/checkpoints/"\n')
    assert modules_spelling(tmp_path, "checkpoints/") == ["bootstrap/run.py", "contract/layout.py"]
    assert modules_spelling(tmp_path, "attempt-") == ["ops/fleet/m.py"]


def test_the_worker_shell_names_the_same_local_checkpoint_directory():
    startup = (REPO / "bootstrap" / "startup.sh").read_text()
    found = re.findall(r"TPUPOD_LOCAL_CHECKPOINT_DIR=(\S+)\"", startup)
    assert found == [layout.local_checkpoint_dir("$TPUPOD_ROOT", "$MD_RUN_ID")]


def test_the_worker_shell_names_the_same_checkpoint_directory():
    startup = (REPO / "bootstrap" / "startup.sh").read_text()
    found = re.findall(r"TPUPOD_CHECKPOINT_DIR=\$MD_RUN_DIR/(\w+)", startup)
    assert found == [layout.CHECKPOINTS]
    assert layout.checkpoint_dir("gs://b/runs/s/r/") == "gs://b/runs/s/r/checkpoints"
    assert layout.attempt_log("gs://b/r", 2, 1) == "gs://b/r/tpupod/attempt-2/worker-1.log"
