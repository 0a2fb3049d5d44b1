"""A job that reports what tpupod hands it (tests/e2e/test_job_contract.py reads its output from
the bucket). No JAX: the contract is the environment, whatever the program does."""

import hashlib
import json
import os
import signal
import sys
import time

import six  # from this job's own environment (python: uv), not tpupod's
import tpupod_job

KEYS = (
    "TPUPOD_RUN_ID",
    "TPUPOD_ATTEMPT",
    "TPUPOD_PROCESS_ID",
    "TPUPOD_NUM_PROCESSES",
    "JAX_COORDINATOR_ADDRESS",
    "TPUPOD_CHECKPOINT_DIR",
    "TPUPOD_STATUS_FILE",
    "TPUPOD_GRACE_S",
    "TPUPOD_MAX_LOSS_S",
    "TPUPOD_COMPILE_CACHE",
    "STORAGE_EMULATOR_HOST",
    "TENSORSTORE_GCS_HTTP_URL",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
    "GREETING",
)
secret = os.environ.get("PROBE_TOKEN", "")
report = {key: os.environ.get(key) for key in KEYS}
report.update(
    python=sys.executable,
    prefix=sys.prefix,
    six=six.__version__,
    secret_sha256=hashlib.sha256(secret.encode()).hexdigest(),
)
print("contract " + json.dumps(report, sort_keys=True), flush=True)

stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
if int(os.environ["TPUPOD_ATTEMPT"]) >= int(os.environ.get("FATAL_FROM_ATTEMPT", "99")):
    print("refusing to run: a usage error", flush=True)
    sys.exit(2)
for step in range(1, 100_000):
    tpupod_job.progress(step)
    if stop:
        print(f"stopped at step {step}", flush=True)
        sys.exit(0)  # exit 0 after SIGTERM, as many programs do: tpupod must not call it done
    time.sleep(0.2)
