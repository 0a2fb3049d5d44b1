"""The exit codes are defined once for Python (contract.exit_codes); the files on a worker that
cannot import contract keep literals, and each must say what contract says."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

from contract import exit_codes
from contract.job import ExitCodes

REPO = Path(__file__).resolve().parents[2]


def jobkit():
    path = REPO / "bootstrap" / "jobkit" / "tpupod_job" / "__init__.py"
    spec = importlib.util.spec_from_file_location("tpupod_job_copy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_job_helper_exits_as_contract_says():
    assert jobkit().EXIT_PREEMPTED == exit_codes.EXIT_PREEMPTED


def test_a_jobs_default_exit_codes_are_contracts():
    assert ExitCodes().preempted == (exit_codes.EXIT_PREEMPTED,)
    assert ExitCodes().fatal == (exit_codes.EXIT_BAD_INPUT,)


def test_the_builtin_jobs_file_and_the_unit_say_the_same():
    builtin = yaml.safe_load((REPO / "trainer" / "tpupod-job.yaml").read_text())
    assert builtin["exit_codes"] == {
        "preempted": [exit_codes.EXIT_PREEMPTED],
        "fatal": [exit_codes.EXIT_BAD_INPUT],
    }
    unit = (REPO / "bootstrap" / "tpupod-job@.service").read_text()
    assert re.search(rf"^SuccessExitStatus={exit_codes.EXIT_PREEMPTED}$", unit, re.M)
