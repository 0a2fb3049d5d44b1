"""Host maintenance is not a preemption: an on-demand node under maintenance (health
UNHEALTHY_MAINTENANCE, metadata maintenance-event TERMINATE_ON_HOST_MAINTENANCE) reboots with its
disk and runs its startup script again, which starts the job; the watcher waits for it, with no
SSH restart and no incident. A spot node is ended by maintenance, as GCE does."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from demo.reference import pod_provider
from localpod.pod import LocalPod
from localpod.state import SliceState as PodState
from localpod.vm import memory
from ops.watch import Watcher
from ops.watch.incident import IncidentStore
from ops.watch.journal import Journal
from tests.e2e.test_provider import CONFIG

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def maintenance_event(pod: LocalPod) -> str:
    worker = pod.describe().pod
    url = (f"http://{worker['addresses'][0]}:{worker['metadata_port']}"
           "/computeMetadata/v1/instance/maintenance-event")  # fmt: skip
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        return answer.read().decode()


def test_an_on_demand_node_under_maintenance_is_waited_for_not_restarted(
    pod_factory, tmp_path: Path
) -> None:
    pod = pod_factory(spot=False)
    pod.up()
    booted = pod.paths.tpupod_root(0) / "booted"
    deadline = time.monotonic() + 60
    while not booted.exists():
        assert time.monotonic() < deadline, "the stand-in startup script never ran"
        time.sleep(0.1)
    first_boot = booted.stat().st_mtime
    held = memory.worker_memory(pod.paths.root, 0) / "held-in-memory"  # /dev/shm on a TPU VM
    held.write_text("lost at a reboot")
    provider = pod_provider(pod.paths.root)
    watcher = Watcher(provider, Journal(tmp_path / "journal.jsonl"), CONFIG,
                      store=IncidentStore(tmp_path / "incident.json"))  # fmt: skip
    for _ in range(10):  # calm before: the stand-in job runs on both workers
        watcher.step()
        time.sleep(CONFIG.poll)
    pod.maintenance(seconds=3, wait=False)
    seen_health, events = set(), set()
    end = time.monotonic() + 90
    while time.monotonic() < end:
        watcher.step()
        info = pod.describe()
        seen_health.add(info.health)
        if info.health == "UNHEALTHY_MAINTENANCE":
            event = maintenance_event(pod)
            if pod.describe().health == "UNHEALTHY_MAINTENANCE":  # not read as it just ended
                events.add(event)
        rebooted = booted.exists() and booted.stat().st_mtime > first_boot
        if info.health == "HEALTHY" and rebooted and "UNHEALTHY_MAINTENANCE" in seen_health:
            break
        time.sleep(CONFIG.poll)
    else:
        pytest.fail(f"no reboot after maintenance: {seen_health}")
    for _ in range(10):  # calm after: the job the startup script started again runs
        watcher.step()
        time.sleep(CONFIG.poll)
    watcher.close()
    assert events == {"TERMINATE_ON_HOST_MAINTENANCE"}
    assert booted.exists() and not held.exists()  # the reboot kept the disk, not the memory
    assert maintenance_event(pod) == "NONE"
    names = [e["event"] for e in watcher.journal.events]
    assert watcher.state.incident is None and watcher.state.failures == 0, names
    assert not {"detected", "restarted", "recreated"} & set(names), names
    assert provider.describe().state.value == "READY"
    probes = watcher.workers(provider.describe().workers).probe()  # same host keys: SSH works
    assert all(p.reachable and p.alive for p in probes), [p.error for p in probes]
    watcher.close()


def test_maintenance_ends_a_spot_node(pod_factory) -> None:
    pod = pod_factory()
    pod.up()
    pod.maintenance(seconds=1, wait=False)
    assert pod.wait_for({PodState.PREEMPTED}, 30).state is PodState.PREEMPTED
    assert pod.describe().health is None  # a preemption sets no health of its own
