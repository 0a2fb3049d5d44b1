"""Hang forensics through the real `watch`: worker 0's job hangs inside a known function,
worker 1's keeps beating; watch (its state in the pod's bucket, as the CLI runs it) detects the
hang and, before restarting, stores every worker's py-spy stacks and log tail beside the journal
and in the bucket, names the files in the journal, and `tpupod logs --incident N` prints them,
from the bucket when the journal's directory has none (a laptop reading the watcher VM's).

The pod boots a stand-in startup script (like tests/e2e/conftest.py's) whose job is a small
Python script run under a wrapper (`job.pid` = the wrapper, as with jobctl.sh), and whose
bundle environment has py-spy where a real worker's `.venv` has it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from demo.reference import pod_provider
from localpod.pod import LocalPod
from ops.watch import Limits, WatchConfig, Watcher
from ops.watch.journal import Journal
from ops.watch.remote_state import RemoteState

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
REPO = Path(__file__).resolve().parents[2]
PY_SPY = Path(sys.executable).with_name("py-spy")

STAND_IN = r"""import json, os, sys, time
root, worker = os.environ["TPUPOD_ROOT"], int(sys.argv[1])
def status(step):
    doc = {"state": "training", "step": step, "pid": os.getpid(), "heartbeat": time.time()}
    with open(root + "/status.tmp", "w") as f:
        json.dump(doc, f)
    os.replace(root + "/status.tmp", root + "/status.json")
def stuck_in_known_function():
    status(7)
    print("step 7: about to wait forever", flush=True)
    while True:
        time.sleep(1)
def beating_normally():
    step = 7
    while True:
        step += 1
        status(step)
        time.sleep(0.3)
stuck_in_known_function() if worker == 0 else beating_normally()
"""

STARTUP = r"""#!/bin/bash
set -euo pipefail
md() { curl -sf -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/$1"; }
number=$(md instance/attributes/agent-worker-number)
mkdir -p "$TPUPOD_ROOT/current/.venv/bin"
ln -sf @PY_SPY@ "$TPUPOD_ROOT/current/.venv/bin/py-spy"
cat > "$TPUPOD_ROOT/stand_in.py" <<'PY'
@STAND_IN@PY
setsid bash -c 'echo $$ > "$TPUPOD_ROOT/job.pid"
  @PYTHON@ "$TPUPOD_ROOT/stand_in.py" '"$number"' >> "$TPUPOD_ROOT/job.log" 2>&1' \
  </dev/null >/dev/null 2>&1 &
while [ ! -s "$TPUPOD_ROOT/status.json" ]; do sleep 0.05; done
echo '{"state": "ok", "phase": "start-job"}' > "$TPUPOD_ROOT/bootstrap.json"
"""


class Captured(Exception):
    """Ends the watch loop once the forensics are journaled."""


@pytest.mark.skipif(not PY_SPY.exists(), reason="py-spy not installed in this environment")
def test_a_hang_is_dumped_with_its_stacks_before_the_restart(tmp_path: Path):
    script = tmp_path / "startup.sh"
    script.write_text(
        STARTUP.replace("@PY_SPY@", str(PY_SPY))
        .replace("@STAND_IN@", STAND_IN)
        .replace("@PYTHON@", sys.executable)
    )
    pod = LocalPod(tmp_path / "pod", workers=2, startup_script=script)
    state = tmp_path / "state" / "local"
    journal = Journal(state / "journal.jsonl", Console(stderr=True))
    limits = Limits(hang=3, start=60, stall=400, bootstrap=60, ssh=30, preempt_grace=30)
    cfg = WatchConfig(limits=limits, poll=0.5, max_failures=3, backoff_base=30.0)
    deadline = time.time() + 90

    def until_captured(watcher, probes):
        if any(e["event"] == "forensics" for e in journal.events):
            raise Captured
        assert time.time() < deadline, f"no forensics; journal: {journal.events[-3:]}"

    env = {
        **os.environ,
        "TPUPOD_STATE_DIR": str(state.parent),
        "TPUPOD_POD_DIR": str(pod.paths.root),
    }
    cli = [sys.executable, "-m", "ops", "logs", "--stack", "local", "--incident"]

    def logs(number: int, state_dir: Path = state.parent) -> subprocess.CompletedProcess:
        env["TPUPOD_STATE_DIR"] = str(state_dir)
        return subprocess.run(
            [*cli, str(number)], cwd=REPO, env=env, capture_output=True, text=True
        )

    try:
        pod.up()
        provider = pod_provider(pod.paths.root)
        bucket = RemoteState.for_target(provider.target)
        watcher = Watcher(provider, journal, cfg, on_poll=until_captured, store=bucket)
        watcher.state.since = 0.0  # the stand-ins wrote their status before this watch began
        with pytest.raises(Captured):
            watcher.run()
        event = next(e for e in journal.events if e["event"] == "forensics")
        # Read back while the pod's bucket is up: here, and from a directory without the files.
        shown, remote = logs(event["incident"]), logs(event["incident"], tmp_path / "laptop")
        missing = logs(99, tmp_path / "laptop")
    finally:
        pod.down()

    detected = next(e for e in journal.events if e["event"] == "detected")
    assert detected["kind"] == "hang" and "worker 0" in detected["message"]
    local = [Path(f) for f in event["files"] if not f.startswith("gs://")]
    uris = [f for f in event["files"] if f.startswith("gs://")]
    incidents = f"gs://{bucket.bucket.name}/ops/local/incidents/"
    prefix = f"{incidents}{event['incident']}/"
    assert uris == [prefix + "worker-0.txt", prefix + "worker-1.txt"]
    assert [f.name for f in local] == ["worker-0.txt", "worker-1.txt"]
    assert all(str(f) in event["message"] for f in event["files"])
    assert local[0].parent == state / "incidents" / str(event["incident"])
    hung, beating = (f.read_text() for f in local)
    assert "stuck_in_known_function" in hung and "Thread" in hung
    assert "step 7: about to wait forever" in hung  # the log tail
    assert "beating_normally" in beating
    # No restart before the evidence: the forensics line precedes any restart attempt.
    names = [e["event"] for e in journal.events]
    assert "restarted" not in names[: names.index("forensics")]

    assert shown.returncode == 0, shown.stderr
    assert "worker-1.txt" in shown.stdout and "stuck_in_known_function" in shown.stdout
    assert remote.returncode == 0, remote.stderr
    assert prefix + "worker-0.txt" in remote.stdout and "stuck_in_known_function" in remote.stdout
    assert remote.stdout.index("worker-0.txt") < remote.stdout.index("worker-1.txt")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert "no forensics for incident 99" in missing.stderr and incidents in missing.stderr
    assert f"incidents with forensics: {event['incident']}" in missing.stderr
    assert json.loads((state / "journal.jsonl").read_text().splitlines()[0])["event"]
