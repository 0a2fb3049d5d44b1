"""Pod state on disk, the node states and the slice lifecycle table.

Separate CLI calls share one pod through its directory: `config.json` (what `up` asked for),
`pod.json` (what the controller chose: ports, pids, addresses), `endpoints.json` (what a client of
the pod's cloud needs), `node-spec.json` (what `up` sent to nodes.create), keys, logs and disks.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from contract.node_state import SliceState

PROJECT_ROOT = Path(__file__).resolve().parent.parent
POD_DIR_ENV = "TPUPOD_POD_DIR"


# The TPU API lifecycle, as this pod plays it. MISSING = deleted (no node).
TRANSITIONS: dict[SliceState, frozenset[SliceState]] = {
    SliceState.MISSING: frozenset({SliceState.CREATING}),
    SliceState.CREATING: frozenset({SliceState.READY, SliceState.TERMINATED, SliceState.DELETING}),
    SliceState.READY: frozenset({SliceState.PREEMPTED, SliceState.TERMINATED, SliceState.DELETING}),
    SliceState.PREEMPTED: frozenset({SliceState.DELETING}),
    SliceState.TERMINATED: frozenset({SliceState.DELETING}),
    SliceState.DELETING: frozenset({SliceState.MISSING}),
}


class PodError(Exception):
    """The pod cannot do what was asked: one line for the operator."""


class PodNotUp(PodError):
    pass


def check_transition(old: SliceState, new: SliceState) -> None:
    if new not in TRANSITIONS.get(old, frozenset()):
        raise PodError(f"slice is {old}; it cannot become {new}")


def default_pod_dir() -> Path:
    return Path(os.environ.get(POD_DIR_ENV) or PROJECT_ROOT / ".tpupod").resolve()


@dataclass(frozen=True)
class PodPaths:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def pod(self) -> Path:
        return self.root / "pod.json"

    @property
    def controller_log(self) -> Path:
        return self.root / "controller.log"

    @property
    def emulator_log(self) -> Path:
        return self.root / "emulator.log"

    @property
    def storage(self) -> Path:
        return self.root / "storage"

    @property
    def endpoints(self) -> Path:
        return self.root / "endpoints.json"

    @property
    def node_spec(self) -> Path:
        return self.root / "node-spec.json"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def client_key(self) -> Path:
        return self.keys / "id_ed25519"

    @property
    def registry_unreachable(self) -> Path:
        """Present: workers booted from now on reach no package index (LocalPod.package_index)."""
        return self.root / "registry-unreachable"

    def worker(self, index: int) -> Path:
        return self.root / "workers" / str(index)

    def home(self, index: int) -> Path:
        return self.worker(index) / "home"

    def agent_config(self, index: int) -> Path:
        return self.worker(index) / "agent.json"

    def agent_ready(self, index: int) -> Path:
        return self.worker(index) / "ready"

    def host_key(self, index: int) -> Path:
        """The worker's own SSH host key, on its disk: a recreated VM has a new one."""
        return self.worker(index) / "ssh_host_ed25519_key"

    def tpupod_root(self, index: int) -> Path:
        """$TPUPOD_ROOT (GCP: /var/lib/tpupod, root's): not under the login's HOME."""
        return self.worker(index) / "tpupod"

    def job_pid(self, index: int) -> Path:
        return self.tpupod_root(index) / "job.pid"


def write_json(path: Path, data: dict) -> None:
    """Atomic: a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
