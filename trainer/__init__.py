"""The built-in JAX trainer (README, trainer/README.md).

It keeps its side of the job contract through tpupod_job (bootstrap/jobkit), as any job may: on
a worker a job's PYTHONPATH has it and the dev environment installs it; a `python -m trainer`
started by hand inside a code bundle (a benchmark's reference run) finds it beside this package.
"""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("tpupod_job") is None:
    _JOBKIT = Path(__file__).resolve().parent.parent / "bootstrap" / "jobkit"
    if _JOBKIT.is_dir():
        sys.path.append(str(_JOBKIT))
