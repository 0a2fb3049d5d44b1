"""The slice's lifecycle, played like the TPU API: create, delete, preempt, plus fault injection.

Long operations (create, delete, preempt) run in a background thread and return at once, as the
TPU API's long-running operations do; `on_done` tells the caller (the TPU API's operation) when one
finished, and `describe()` only reads fields and never walks /proc, so clients can poll it often.
Every create is a new VM per worker: a wiped disk, a fresh SSH host key, a new instance name.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from contract import metadata
from localpod import procs
from localpod.state import PodError, PodPaths, SliceState, check_transition
from localpod.vm import memory, worker_vm
from localpod.vm.environment import accelerator_type, worker_attributes
from localpod.vm.metadata_server import MetadataStore
from localpod.vm.worker_vm import Instance

CREATE_TIMEOUT_S = 90.0
DELETE_GRACE_S = 3.0


@dataclass
class Agent:
    index: int
    popen: subprocess.Popen


class Slice:
    def __init__(
        self,
        paths: PodPaths,
        layout: dict,
        store: MetadataStore,
        kill_strays: Callable[[], None],
    ) -> None:
        self.paths = paths
        self.layout = layout
        self.store = store
        self._kill_strays = kill_strays
        self._lock = threading.RLock()  # guards the fields below
        self._op = threading.Lock()  # one long operation at a time
        self.state = SliceState.MISSING
        self.health: str | None = None
        self.detail: str | None = "not created"
        self._agents: dict[int, Agent] = {}
        self.instances: list[Instance] = []  # of the current node, by worker index
        self._busy = False  # preempting or shutting down: agents dying is expected

    # -- reading -----------------------------------------------------------------------------
    def describe(self) -> dict:
        with self._lock:
            workers = []
            if self.state != SliceState.MISSING:
                for index, address in enumerate(self.layout["addresses"]):
                    agent = self._agents.get(index)
                    workers.append(
                        {
                            "index": index,
                            "host": address,
                            "port": self.layout["ssh_ports"][index],
                            "user": self.layout["user"],
                            "key_filename": str(self.paths.client_key),
                            "agent_pid": agent.popen.pid if agent else None,
                            "alive": bool(agent and agent.popen.poll() is None),
                        }
                    )
            return {
                "state": str(self.state),
                "instances": [vars(i) for i in self.instances] if workers else [],
                "health": self.health,
                "detail": self.detail,
                "preempted": self.store.preempted,
                "workers": workers,
            }

    def agent_pids(self) -> set[int]:
        with self._lock:
            return {a.popen.pid for a in self._agents.values()}

    def _set(self, new: SliceState, health: str | None = None, detail: str | None = None):
        with self._lock:
            check_transition(self.state, new)
            self.state, self.health, self.detail = new, health, detail

    def _start_op(
        self,
        what: str,
        allowed_from: set[SliceState],
        target: Callable[[], None],
        begin: Callable[[], None],
        on_done: Callable[[], None] | None = None,
    ) -> None:
        """Check and take the one-operation lock in the caller (so two calls cannot both pass),
        apply the first state change, then run `target` in the background; it frees the lock,
        then calls `on_done`."""
        with self._lock:
            if self.state not in allowed_from:
                raise PodError(f"cannot {what}: slice is {self.state}")
            if not self._op.acquire(blocking=False):
                raise PodError(f"cannot {what}: another operation is running ({self.detail})")
            begin()

        def run() -> None:
            try:
                target()
            finally:
                self._op.release()
                if on_done is not None:
                    on_done()

        threading.Thread(target=run, daemon=True).start()

    # -- create ------------------------------------------------------------------------------
    def create(
        self,
        node_metadata: dict[str, str],
        on_done: Callable[[], None] | None = None,
        accelerator: str | None = None,
        hostnames: list[str] | None = None,
        worker_key: str = metadata.AGENT_WORKER_NUMBER,
    ) -> None:
        """Boot every worker from `node_metadata` (the nodes.create request's metadata);
        `accelerator` is the request's acceleratorType, what workers read as `accelerator-type`
        (default: the pod's own `cpu-N`); `hostnames`: the VMs' names (default: a TPU VM's
        `t1v-n-<hex>-w-<i>`; a managed instance group names its own); `worker_key`: the
        metadata key of each worker's index (localpod.vm.environment.worker_attributes)."""
        begin = partial(self._set, SliceState.CREATING, detail="creating")
        target = partial(self._create, node_metadata, accelerator, hostnames, worker_key)
        self._start_op("create", {SliceState.MISSING}, target, begin, on_done)

    def _create(self, node_metadata: dict[str, str], accelerator: str | None = None,
                names: list[str] | None = None,
                worker_key: str = metadata.AGENT_WORKER_NUMBER) -> None:  # fmt: skip
        try:
            addresses = self.layout["addresses"]
            own = accelerator_type(len(addresses), self.layout["devices_per_worker"])
            accelerator = accelerator or own
            attributes = worker_attributes(node_metadata, addresses, accelerator, worker_key)
            prefix = f"t1v-n-{secrets.token_hex(4)}"  # a new VM: a new instance name
            hostnames = {i: names[i] if names else f"{prefix}-w-{i}" for i in attributes}
            self.store.set_attributes(attributes, hostnames)
            self.store.set_preempted(False)
            instances = [self._spawn_agent(i, hostnames[i]) for i in range(len(addresses))]
            with self._lock:
                self.instances = instances
            worker_vm.write_known_hosts(self.paths, self.layout, instances)
            self._wait_ready()
        except Exception as err:  # noqa: BLE001 - any failure ends creation, reported in describe
            self._stop_agents(grace=0)
            with self._lock:
                self._set(SliceState.TERMINATED, detail=f"create failed: {err}")
            return
        with self._lock:
            self._set(SliceState.READY, health="HEALTHY", detail=None)

    def update_metadata(self, node_metadata: dict[str, str]) -> None:
        """nodes.patch of `metadata`: every worker's metadata server serves the new keys (GCE's
        own keys, such as the accelerator type and endpoints, stay)."""
        with self._lock:
            current = self.store.attributes(0)
            accelerator = current.get("accelerator-type") or accelerator_type(
                len(self.layout["addresses"]), self.layout["devices_per_worker"]
            )
            attributes = worker_attributes(node_metadata, self.layout["addresses"], accelerator)
            self.store.set_attributes(attributes, self.store.hostnames)

    def _spawn_agent(self, index: int, hostname: str) -> Instance:
        popen, instance = worker_vm.boot(self.paths, self.layout, index, hostname)
        with self._lock:
            self._agents[index] = Agent(index, popen)
        return instance

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + CREATE_TIMEOUT_S
        pending = set(self._agents)
        while pending:
            for index in list(pending):
                agent = self._agents[index]
                if agent.popen.poll() is not None:
                    log = self.paths.worker(index) / "agent.log"
                    raise PodError(f"worker {index} agent exited {agent.popen.returncode}; {log}")
                if self.paths.agent_ready(index).exists():
                    pending.discard(index)
            if time.monotonic() > deadline:
                raise PodError(f"workers {sorted(pending)} not up after {CREATE_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    # -- delete ------------------------------------------------------------------------------
    def delete(self, on_done: Callable[[], None] | None = None) -> None:
        allowed = {SliceState.READY, SliceState.PREEMPTED, SliceState.TERMINATED}
        begin = partial(self._set, SliceState.DELETING, detail="deleting")
        self._start_op("delete", allowed, self._delete, begin, on_done)

    def _delete(self) -> None:
        self._stop_agents(grace=DELETE_GRACE_S)
        self.store.set_preempted(False)
        with self._lock:
            self._set(SliceState.MISSING, detail="deleted")
            self.instances = []

    def _stop_agents(self, grace: float) -> None:
        """SIGTERM every worker process, SIGKILL what is left after `grace`, then the agents."""
        with self._lock:
            agents = list(self._agents.values())
        for agent in agents:
            procs.send(procs.descendants(agent.popen.pid), signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(
            procs.descendants(a.popen.pid) for a in agents if a.popen.poll() is None
        ):
            time.sleep(0.1)
        for agent in agents:
            if agent.popen.poll() is None:
                procs.kill_tree(agent.popen.pid, include_root=True)
            agent.popen.wait(timeout=10)
            memory.empty(self.paths.root, agent.index)  # a stopped VM keeps its disk, not its RAM
        self._kill_strays()  # orphans of agents that died early were re-parented to us

    # -- faults ------------------------------------------------------------------------------
    def preempt(self, notice: float) -> None:
        """GCE's spot preemption: preempted=TRUE, SIGTERM, SIGKILL when the notice runs out."""

        def begin() -> None:
            self._busy = True  # READY while the notice runs; dying agents are expected
            self.store.set_preempted(True)  # as GCE: the flag and SIGTERM, the node stays READY
            self.detail = f"preemption notice {notice:g} s"

        self._start_op("preempt", {SliceState.READY}, lambda: self._preempt(notice), begin)

    def _preempt(self, notice: float) -> None:
        self._stop_agents(grace=notice)
        with self._lock:
            self._busy = False
            self._set(SliceState.PREEMPTED, detail=f"notice was {notice:g} s")

    def maintain(self, seconds: float) -> None:
        """GCE host maintenance of a node that is not spot: health UNHEALTHY_MAINTENANCE and
        metadata `maintenance-event` TERMINATE_ON_HOST_MAINTENANCE while it lasts; every VM shuts
        down (SIGTERM, then what is left killed) and boots again after `seconds` on the same disk,
        host key and instance name, running its startup script again. A spot node is not
        maintained but ended (GCE stops spot VMs for host maintenance): preempted, no notice."""
        if self.store.node.preemptible:
            return self.preempt(notice=0.0)

        def begin() -> None:
            self._busy = True
            self.store.set_maintenance_event("TERMINATE_ON_HOST_MAINTENANCE")
            self.health, self.detail = "UNHEALTHY_MAINTENANCE", f"host maintenance {seconds:g} s"

        self._start_op("maintain", {SliceState.READY}, lambda: self._maintain(seconds), begin)
        return None

    def _maintain(self, seconds: float) -> None:
        self._stop_agents(grace=DELETE_GRACE_S)
        time.sleep(seconds)
        for index in range(len(self.layout["addresses"])):
            popen = worker_vm.start_agent(self.paths, index)
            with self._lock:
                self._agents[index] = Agent(index, popen)
        try:
            self._wait_ready()
        except PodError as err:
            self.store.set_maintenance_event("NONE")
            with self._lock:
                self._busy = False
                self._set(SliceState.TERMINATED, detail=f"reboot after maintenance failed: {err}")
            return
        self.store.set_maintenance_event("NONE")
        with self._lock:
            self._busy = False
            self.health, self.detail = "HEALTHY", None

    def signal_job(self, index: int, sig: int) -> int:
        """SIGKILL (crash) or SIGSTOP (hang) worker `index`'s job: the group of job.pid."""
        with self._lock:
            agent = self._agents.get(index)
            if self.state != SliceState.READY or agent is None:
                raise PodError(f"slice is {self.state}; no worker {index} to act on")
        pid_file = self.paths.job_pid(index)
        try:
            pid = int(pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            raise PodError(f"worker {index} has no job ({pid_file} missing)") from None
        tree = {p.pid for p in procs.descendants(agent.popen.pid)}
        if pid not in tree:
            raise PodError(f"worker {index}: job pid {pid} is not running")
        # jobctl makes the job's launcher a process-group leader: signal the whole group.
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
        return pid

    # -- upkeep ------------------------------------------------------------------------------
    def check_agents(self) -> None:
        """A worker agent that dies on its own takes the slice to TERMINATED."""
        with self._lock:
            if self.state != SliceState.READY or self._busy:
                return
            for agent in self._agents.values():
                if agent.popen.poll() is not None:
                    self._set(
                        SliceState.TERMINATED,
                        detail=f"worker {agent.index} stopped (exit {agent.popen.returncode})",
                    )
                    return

    def shutdown(self) -> None:
        """Stop every worker now (controller exit), even while an operation is running."""
        with self._lock:
            self._busy = True
        self._stop_agents(grace=1.0)
