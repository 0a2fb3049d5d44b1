"""When a re-run restarts the job: only for new code or a changed job (its spec or environment).

One worker of the bare slice, with a bundle whose `trainer` package is a small stdlib stand-in
(the real trainer's start-up would add half a minute and test nothing more here).
"""

from __future__ import annotations

import json
import subprocess
import time

from infra.builtin_job import builtin
from infra.bundle_archive import build_bundle

STANDIN = '''"""Stand-in trainer: status file per the seam, exit 75 on SIGTERM."""
import json, os, signal, sys, time

path = os.environ["TPUPOD_STATUS_FILE"]


def write(**doc):
    doc.update(pid=os.getpid(), heartbeat=time.time(), args=sys.argv[1:])
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


signal.signal(signal.SIGTERM, lambda *_: (write(state="preempted", exit_code=75), sys.exit(75)))
for step in range(1, 100000):
    write(state="training", step=step)
    time.sleep(0.2)
'''


def status(single) -> dict | None:
    try:
        return json.loads((single.root(0) / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return None


def wait_pid(single, not_pid: int | None = None, timeout: float = 30) -> int:
    """The pid of a training stand-in (other than `not_pid`)."""
    deadline = time.monotonic() + timeout
    while True:
        s = status(single)
        if s and s["state"] == "training" and s["pid"] != not_pid:
            return s["pid"]
        assert time.monotonic() < deadline, s
        time.sleep(0.1)


def test_unchanged_reruns_keep_the_trainer_changed_args_restart_it(single, stage, tmp_path):
    root = tmp_path / "bundle"
    stage(root)
    (root / "trainer" / "__main__.py").write_text(STANDIN)
    bundle = build_bundle(root)
    single.publish(bundle)
    (first,) = single.boot()
    assert first.returncode == 0, first.output
    pid = wait_pid(single)

    # Two re-runs at once: one waits for the other; neither starts a second trainer. A third
    # holder keeps the lock for a moment, so both re-runs meet it whatever their timing (an
    # unchanged re-run can finish before the second one even starts).
    lock = single.root(0) / ".bootstrap" / "lock"
    holder = subprocess.Popen(["flock", str(lock), "sleep", "2"])
    deadline = time.monotonic() + 10
    while subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 0:
        assert time.monotonic() < deadline, "the lock holder never took the lock"
        time.sleep(0.05)
    try:
        again = single.boot([0, 0])
    finally:
        holder.kill()
        holder.wait()
    assert [r.returncode for r in again] == [0, 0], again
    outputs = "\n---\n".join(r.output for r in again)
    assert "another bootstrap is running" in outputs, outputs
    assert all("job already running" in r.output for r in again), outputs
    assert wait_pid(single) == pid

    single.publish(bundle, tpupod_job=builtin("--config tiny --steps 7").spec.to_json())
    (changed,) = single.boot()
    assert changed.returncode == 0, changed.output
    assert "job environment changed" in changed.output
    new = wait_pid(single, not_pid=pid)
    assert status(single)["args"] == ["--config", "tiny", "--steps", "7"]
    assert (single.root(0) / "job.exit").exists() is False  # moved aside by the new start
    assert (single.root(0) / "job.last-exit").read_text().strip() == "75"
    assert "job exited 75 after SIGTERM" in (single.root(0) / "job.log").read_text()
    assert single.job_pid(0) != pid and new != pid
