"""Suite-wide: trainers started by tests keep their caches inside the test session, never in the
developer's home (the peak-probe cache defaults to ~/.cache/tpupod). And the session writes
bytecode whatever the caller's PYTHONDONTWRITEBYTECODE: the suite starts hundreds of Python
processes (trainers, CLIs, pod agents), and with the variable set (as in some CI images) each one
compiles jax, flax, optax, grain and paramiko from source again. Local pods' workers are cold (their
own empty caches) and install from the bucket: the session's first pod builds its environments from
the package index and later pods' buckets start with them (localpod.env_seed).

The README's test command runs the suite on two pytest-xdist processes (the machines have two
cores, and most of a pod test is waiting): the tests whose pods boot tpupod's own startup script
are one unit of work, so those pods run one at a time, in one process whose session seeds the
bucket's environments once, beside every other test module."""

from __future__ import annotations

import os
import sys

import pytest

# The GCS emulator speaks JSON over HTTP, no gRPC: this process's gcsfs takes the plain client, as
# the local pod's workers and the trainers the tests start do (the variable is read at import).
assert "gcsfs" not in sys.modules, "gcsfs imported before the suite could choose its client"
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

from localpod.env_seed import SEED_VAR  # noqa: E402

# --import-mode=importlib puts no test directory on sys.path; the guard lives beside us.
sys.path.insert(0, os.path.dirname(__file__))
import loopback_only  # noqa: E402
from loopback_only import _loopback_only  # noqa: E402, F401 - autouse: guards every test

loopback_only.install()


def pytest_sessionfinish(session, exitstatus):
    if (report := loopback_only.uncharged_report()) is not None:
        sys.stderr.write(f"\n{report}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# The test modules whose local pods boot tpupod's own startup script (uv, the environment from the
# bucket, the trainer or a job): the heavy ones, and the ones that share the session's seeded
# environments. Pods with a stand-in startup script are light and run beside them.
POD_TESTS = (
    "tests/bench/test_fault_campaign.py",
    "tests/bootstrap/test_localpod_boot.py",
    "tests/bootstrap/test_rollout.py",
    "tests/e2e/test_demo.py",
    "tests/e2e/test_forensics.py",
    "tests/e2e/test_job_contract.py",
    "tests/e2e/test_jobs.py",
    "tests/e2e/test_maxtext.py",
    "tests/e2e/test_watch.py",
    "tests/e2e/test_watcher.py",
    "tests/localpod/test_package_index.py",
    "tests/localpod/test_stack_specs.py",
    "tests/localpod/test_worker_vm.py",
)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown to pytest run with -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """`pytest -n 2`: the POD_TESTS are one unit of work (one xdist process runs them in order, one
    such pod at a time), every other test module a unit of its own (module fixtures kept). Not an
    xdist_group marker: pytest-xdist 3.8 names groups through `item._nodeid`, which pytest 9's
    nodes no longer read (the groups are silently ignored)."""
    if config.getvalue("dist") != "load":  # an explicit --dist is the caller's choice
        return None
    from xdist.scheduler import LoadScopeScheduling

    class PodTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "pods" if nodeid.startswith(POD_TESTS) else nodeid.split("::", 1)[0]

    return PodTestsTogether(config, log)


@pytest.fixture(autouse=True, scope="session")
def _session_env(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        mp.setattr(sys, "dont_write_bytecode", False)
        if "TPUPOD_CACHE_DIR" not in os.environ:
            mp.setenv("TPUPOD_CACHE_DIR", str(tmp_path_factory.mktemp("tpupod-cache")))
        mp.setenv(SEED_VAR, str(tmp_path_factory.mktemp("env-seed")))
        yield
