"""`tpupod demo` as the README runs it: the built-in trainer's job meets a hang, a crash, then a
preemption with notice (its first recreate meets a stockout) on a real local pod, recovered by
the pod's watcher VM (its own `tpupod watch` through the pod's TPU API) while the demo process
only observes; its final checkpoint bitwise equal, array by array, to an uninterrupted run's (the
demo exits 0 only then).

`slow` (3-4 minutes each, the TPU API path and `--api compute`, with cold workers, whose every
boot installs from the bucket): CI runs each of its parts on its own pod instead (the watcher
VM's recovery and its kill: test_watcher.py; the next zone's request filed beside a waiting one: test_capacity.py; a user job bitwise equal after
a crash and a preemption, through Compute Engine: test_jobs.py; the Compute Engine API, its
stockout and zone fallback: tests/localpod/test_compute_api.py; a hang: test_forensics.py)."""

from __future__ import annotations

import pytest
from google.cloud import tpu_v2

from localpod.gcp.iam_report import summarize
from localpod.vm import watcher_vm
from ops import watch
from ops.cli import main
from ops.watch.journal import read

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def counted(calls: list[str], name: str, method):
    """The real method, called through; each call of this process noted in `calls`."""

    def call(self, *args, **kwargs):
        calls.append(name)
        return method(self, *args, **kwargs)

    return call


def test_demo_recovers_through_the_watcher_vm_with_equal_weights(tmp_path, capsys, monkeypatch):
    calls: list[str] = []  # what this (the laptop's) process asks of the TPU API, and watch
    for name in ("create_node", "delete_node"):
        monkeypatch.setattr(tpu_v2.TpuClient, name,
                            counted(calls, name, getattr(tpu_v2.TpuClient, name)))  # fmt: skip
    monkeypatch.setattr(watch.Watcher, "run", counted(calls, "watch", watch.Watcher.run))
    pod_dir = tmp_path / "demo"
    code = main(["demo", "--pod-dir", str(pod_dir)])  # the default steps, as the README runs it
    out = capsys.readouterr().out
    events = read(pod_dir / "journal.jsonl")
    messages = [f"{e['event']}: {e['message']}" for e in events]
    assert code == 0, (out, messages)
    # The recovery was the watcher VM's: it held the lease, and this process never ran watch
    # nor created or deleted a node (its one create is the pod's own `up`).
    lease = next(e for e in events if e["event"] == "lease")
    assert lease["holder"] == watcher_vm.HOLDER, messages
    assert calls == ["create_node"], calls
    injected = {e["kind"]: e["time"] for e in events if e["event"] == "injected"}
    assert all(e.get("by") == "demo" for e in events if e["event"] in ("injected", "lease"))
    watcher = [e for e in events if e.get("by") != "demo"]
    detected = {e["kind"]: e for e in watcher if e["event"] == "detected"}
    resumed = {e["kind"]: e for e in watcher if e["event"] == "resumed"}
    assert set(detected) == set(resumed) == {"preemption", "hang", "crash"}, messages
    # preemption with notice: detected within 2 s, resumed exactly at the preemption step
    latency = detected["preemption"]["time"] - injected["preemption"]
    print(f"preemption detected {latency:.2f}s after injection")
    assert latency < 2.0, messages
    assert resumed["preemption"]["steps_lost"] == 0, messages
    # the slice's zone had no capacity: its queued resource waited there past the zone's
    # patience, the other zone's was filed beside it and filled first, and the waiting one was
    # withdrawn then; charged to neither budget
    names = [e["event"] for e in watcher]
    assert names.count("beside") == 1 and names.count("recreated") == 1, messages
    beside = next(e for e in watcher if e["event"] == "beside")
    recreated = next(e for e in watcher if e["event"] == "recreated")
    assert beside["zone"] != beside["next_zone"] == recreated["zone"], messages
    assert [e["zone"] for e in watcher if e["event"] == "queued"] == [
        beside["zone"],
        recreated["zone"],
    ]
    withdrawn = [e["zones"] for e in watcher if e["event"] == "withdrawn"]
    assert withdrawn == [[beside["zone"]]] and "stockout" not in names, messages
    done = next(e for e in watcher if e["event"] == "done")
    assert (done["preemptions"], done["failures"]) == (1, 2), messages
    attempts = [e["attempt"] for e in watcher if e["event"] in ("restarted", "recreated")]
    assert attempts == [2, 3, 4], messages  # hang, crash, preemption: each a new attempt
    # the hang is found by heartbeat age; its stacks go to the bucket before every worker restarts
    assert "heartbeat" in detected["hang"]["message"], messages
    forensics = next(e for e in watcher if e["event"] == "forensics")
    stored = [f for f in forensics["files"] if f.startswith("gs://")]
    assert [f.rsplit("/", 1)[1] for f in stored] == ["worker-0.txt", "worker-1.txt"], forensics
    assert names.index("forensics") < names.index("restarted"), messages
    assert "recovered by" in out and watcher_vm.HOLDER in out
    assert "equals uninterrupted run" in out and "yes" in out.split("equals uninterrupted run")[1]
    words = " ".join(out.replace("│", " ").split())  # the table wraps its cells
    assert "bitwise equal" in words and "arrays and" in words, words
    # The recorded demo: every call the demo made (its terminal, the watcher VM, the
    # workers) allowed by stack v4-32's grants, every service enabled, every role used.
    iam = summarize(pod_dir)
    assert iam.least_privilege, iam.lines()
    assert "IAM (the stack's grants)" in out and "0 refused" in words
    assert not list(pod_dir.glob("pod.json"))  # torn down
    assert not watcher_vm.running(pod_dir)


def test_demo_on_the_compute_engine_path_recovers_with_equal_weights(tmp_path, capsys):
    """`tpupod demo --api compute` (issue 51): the slice a managed instance group through the
    pod's Compute Engine API, recovered by the watcher VM as a Compute Engine stack's watcher
    account; the stockout sends the recreate to the other zone."""
    pod_dir = tmp_path / "demo"
    code = main(["demo", "--api", "compute", "--pod-dir", str(pod_dir)])
    out = capsys.readouterr().out
    events = read(pod_dir / "journal.jsonl")
    messages = [f"{e['event']}: {e['message']}" for e in events]
    assert code == 0, (out, messages)
    lease = next(e for e in events if e["event"] == "lease")
    assert lease["holder"] == watcher_vm.HOLDER, messages
    watcher = [e for e in events if e.get("by") != "demo"]
    resumed = {e["kind"] for e in watcher if e["event"] == "resumed"}
    assert resumed == {"preemption", "hang", "crash"}, messages
    stockout = next(e for e in watcher if e["event"] == "stockout")
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in stockout["message"], messages
    recreated = next(e for e in watcher if e["event"] == "recreated")
    assert recreated["zone"] == "local-b", messages
    words = " ".join(out.replace("│", " ").split())
    assert "bitwise equal" in words and "a managed instance group through Compute Engine" in words
    assert summarize(pod_dir).least_privilege  # the Compute Engine role: used, and enough
    assert not list(pod_dir.glob("pod.json"))  # torn down
