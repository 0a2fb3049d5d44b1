"""The built-in trainer keeps its side of the job contract as any job can: through tpupod_job
(issue 49). It starts JAX with `tpupod_job.init`, stops on `tpupod_job.should_stop` and writes
its status with `tpupod_job.write_status`; none of the trainer's modules does any of it itself.
A second copy of the start, the SIGTERM handling or the status writer would drift from what user
jobs get. Read from the source (a run of each path is in test_trainer_multiprocess,
test_data_train and the local pod's e2e tests)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What only tpupod_job may do: the call, and why it belongs there.
OWN_START = {
    "jax.distributed.initialize": "start JAX through tpupod_job.init",
    "signal.signal": "SIGTERM is tpupod_job's (init installs it, should_stop reads it)",
    "multihost_utils.reached_preemption_sync_point": "ask tpupod_job.should_stop",
    "reached_preemption": "ask tpupod_job.should_stop",
}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def own_starts(source: str) -> list[str]:
    """The calls in `source` that only tpupod_job may make."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            for banned in OWN_START:
                if name == banned or name.endswith(f".{banned}"):
                    found.append(f"{name} (line {node.lineno}): {OWN_START[banned]}")
    return found


def test_the_checker_finds_a_start_of_its_own():
    """Negative control: the trainer's old start and preemption check are found."""
    old = (
        "import jax, signal\n"
        "jax.distributed.initialize(coordinator_address='x', num_processes=2, process_id=0)\n"
        "signal.signal(signal.SIGTERM, lambda *_: None)\n"
        "checkpoints.manager.reached_preemption(3)\n"
    )
    assert len(own_starts(old)) == 3
    assert own_starts("import tpupod_job\ntpupod_job.init(60, distributed=True)\n") == []


def test_the_trainer_starts_stops_and_reports_through_tpupod_job():
    sources = {p.name: p.read_text() for p in sorted((ROOT / "trainer").glob("*.py"))}
    found = {name: own_starts(text) for name, text in sources.items()}
    assert {k: v for k, v in found.items() if v} == {}
    uses = {name for name, text in sources.items() if "tpupod_job." in text}
    assert {"cli.py", "hooks.py", "status.py"} <= uses
    assert "tpupod_job.init(" in sources["cli.py"]
    assert "tpupod_job.should_stop(" in sources["hooks.py"]
    assert "tpupod_job.write_status(" in sources["status.py"]
    assert "os.replace(" not in sources["status.py"]  # no second status writer


def test_a_bundle_without_the_helper_on_its_path_still_finds_it(tmp_path):
    """A `python -m trainer` started by hand inside a code bundle (a benchmark's reference run:
    no PYTHONPATH, no installed project) finds tpupod_job beside the package. `-S`: no site
    directory, so the dev environment's installed copy is out of reach too."""
    import subprocess
    import sys

    code = "import sys; sys.path.insert(0, sys.argv[1]); import trainer.status, tpupod_job; " \
           "print(tpupod_job.__file__)"  # fmt: skip
    out = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(ROOT / "bootstrap" / "jobkit" / "tpupod_job" / "__init__.py")
