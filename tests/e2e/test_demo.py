"""`tpupod demo` with few steps: a preemption with notice (its first recreate meets a stockout) and
a hang on a real local pod, recovered by watch through the pod's TPU API, final weights bitwise
equal to an uninterrupted run (the demo exits 0 only then)."""

from __future__ import annotations

import pytest

from ops.cli import main
from ops.journal import read

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_demo_recovers_with_no_lost_steps_and_equal_weights(tmp_path, capsys):
    pod_dir = tmp_path / "demo"
    code = main(["demo", "--steps", "40", "--pod-dir", str(pod_dir)])
    out = capsys.readouterr().out
    events = read(pod_dir / "journal.jsonl")
    messages = [f"{e['event']}: {e['message']}" for e in events]
    assert code == 0, (out, messages)
    injected = {e["kind"]: e["time"] for e in events if e["event"] == "injected"}
    detected = {e["kind"]: e for e in events if e["event"] == "detected"}
    resumed = {e["kind"]: e for e in events if e["event"] == "resumed"}
    assert set(detected) == set(resumed) == {"preemption", "hang"}, messages
    # preemption with notice: detected within 2 s, resumed exactly at the preemption step
    latency = detected["preemption"]["time"] - injected["preemption"]
    print(f"preemption detected {latency:.2f}s after injection")
    assert latency < 2.0, messages
    assert resumed["preemption"]["steps_lost"] == 0, messages
    # the first recreate met a stockout: retried after a backoff, charged to neither budget
    names = [e["event"] for e in events]
    assert names.count("stockout") == 1 and names.count("recreated") == 1, messages
    done = next(e for e in events if e["event"] == "done")
    assert (done["preemptions"], done["failures"]) == (1, 1), messages
    # the hang is found by heartbeat age, then every worker restarts
    assert "heartbeat" in detected["hang"]["message"], messages
    assert "equals uninterrupted run" in out and "yes" in out.split("equals uninterrupted run")[1]
    assert not list(pod_dir.glob("pod.json"))  # torn down
