"""The campaign's damaged-newest faults cut the newest committed, verified step's largest state
file to half, through the GCS emulator, leave every other object as it was, and wait until an
older committed step stands behind it (with none, a restore has nothing to fall back to)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from bench import faults as schedules
from contract.status import JobStatus
from localpod import faults
from localpod.faults import committed_steps, lacks_fallback
from localpod.gcp import storage
from ops.fleet.probe import Probe

BUCKET = "damage-test"
PREFIX = "runs/local/r1/checkpoints"


class FakePod:
    run_prefix = "runs/local/r1"

    def __init__(self, url: str) -> None:
        self.url = url
        self.crashed: list[int] = []
        self.lost: list[int] = []  # workers whose local copies went with the crash

    def endpoints(self) -> dict:
        """A bare emulator's: any operator token goes (it enforces no IAM)."""
        token = Path(tempfile.gettempdir()) / "tpupod-damage-test.token"
        token.write_text("ya29.any\n")
        operator = {"email": "operator@example.com", "token_file": str(token)}
        return {"storage": self.url, "bucket": BUCKET, "identities": {"operator": operator}}

    def crash(self, worker: int) -> None:
        self.crashed.append(worker)

    def lose_local_checkpoints(self, worker: int) -> None:
        self.lost.append(worker)


def _put(url: str, objects: dict[str, bytes]) -> None:
    for name, data in objects.items():
        storage.upload(url, BUCKET, name, data, "application/octet-stream")


def _step(step: int, committed: bool = True, manifest: bool = True, size: int = 10) -> dict:
    files = {f"{PREFIX}/{step}/state/small": b"s" * 10, f"{PREFIX}/{step}/state/large": b"L" * size}
    if manifest:
        files[f"{PREFIX}/{step}/tpupod-manifest.json"] = b"{}"
    if committed:
        files[f"{PREFIX}/{step}/commit_success.txt"] = b"ok"
    return files


def test_the_newest_committed_verified_step_loses_half_its_largest_state_file():
    with storage.running_emulator(BUCKET) as url:
        objects = {**_step(10), **_step(20, size=1000),
                   **_step(30, committed=False, size=1000),  # manifest, no commit: not newest
                   **_step(40, manifest=False, size=1000)}  # committed, never verified  # fmt: skip
        _put(url, objects)
        pod = FakePod(url)
        assert committed_steps(pod) == [10, 20]
        assert faults.inject(pod, "damaged-crash") == {"damaged": 20, "behind": 10}
        after = {o["name"]: o["size"] for o in storage.list_objects(url, BUCKET, PREFIX)}
        assert after.pop(f"{PREFIX}/20/state/large") == 500
        assert after == {name: len(data) for name, data in objects.items()
                         if name != f"{PREFIX}/20/state/large"}  # fmt: skip


def _watcher(step: int):
    journal = SimpleNamespace(events=[], event=lambda *a, **k: journal.events.append((a, k)))
    probes = [Probe(0, bootstrap={"state": "ok"}, alive=True,
                    status=JobStatus(step=step, updated=time.time()))]  # fmt: skip
    state = SimpleNamespace(incident=None, since=0.0)
    return SimpleNamespace(state=state, journal=journal), probes


def test_a_damage_fault_waits_until_an_older_committed_step_stands_behind_the_newest():
    with storage.running_emulator(BUCKET) as url:
        pod = FakePod(url)
        _put(url, {**_step(10), **_step(20, committed=False)})  # 20: a save still in flight
        assert lacks_fallback(pod) == "a committed step behind the newest (committed: [10])"
        sched = schedules.Schedule(pod, ["damaged-crash"])
        watcher, probes = _watcher(25)
        sched(watcher, probes)
        sched(watcher, probes)
        assert pod.crashed == [] and sched.injected == []
        names = [a[0] for a, _ in watcher.journal.events]
        assert names == ["fault_waiting"]  # journaled once, not at every poll
        assert (
            "waits at step ~25 for a committed step behind the newest"
            in (watcher.journal.events[0][0][1])
        )
        _put(url, {f"{PREFIX}/20/commit_success.txt": b"ok"})  # 20 commits: 10 stands behind it
        assert lacks_fallback(pod) is None
        sched(*_watcher(30))
        assert pod.crashed == [0] and pod.lost == [0]
        assert [(f["damaged"], f["behind"]) for f in sched.injected] == [(20, 10)]
        # negative control: an unreachable bucket is a reason to wait, not a fault to inject
        assert lacks_fallback(FakePod("http://127.0.0.1:9")).startswith("a listing of the")


def test_the_damage_rides_through_the_buckets_injected_errors():
    """Under the campaign's storage errors the harness's own requests fail too: a damage fault
    that gave up on the first 503 was a plain kill (seen in a campaign leg)."""
    import json
    import urllib.request

    from localpod.gcp.storage_faults import CONTROL_PATH

    with storage.running_emulator(BUCKET) as url:
        _put(url, {**_step(10), **_step(20, size=1000)})
        plan = json.dumps({"rate": 0.3, "kinds": ["503", "drop"], "seed": 3}).encode()
        urllib.request.urlopen(urllib.request.Request(f"{url}{CONTROL_PATH}", plan), timeout=5)
        pod = FakePod(url)
        done = faults.inject(pod, "damaged-crash")
        with urllib.request.urlopen(f"{url}{CONTROL_PATH}", timeout=5) as resp:
            report = json.load(resp)
        assert sum(report["injected"].values()) >= 1, report  # some try failed: it tried again
        assert done == {"damaged": 20, "behind": 10}, done
        urllib.request.urlopen(  # errors off, to read the bucket back
            urllib.request.Request(f"{url}{CONTROL_PATH}", b'{"rate": 0}'), timeout=5
        )
        sizes = {o["name"]: o["size"] for o in storage.list_objects(url, BUCKET, PREFIX)}
        assert sizes[f"{PREFIX}/20/state/large"] == 500 and pod.crashed == [0]
