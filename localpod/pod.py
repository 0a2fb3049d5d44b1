"""`LocalPod`: the importable pod API (what the CLI, the ops provider and tests call).

`up` starts the controller daemon, uploads the code bundle, writes the node spec and creates
the node through the pod's Cloud TPU API with Google's client, as ops does on GCP; it returns
once the node is READY. Other calls are loopback HTTP requests to that daemon (the TPU API for
create / delete, the control API for describe and faults), so separate processes share one pod.

    with LocalPod(tmp_path / "pod", workers=2, startup_script=Path("boot.sh")) as pod:
        pod.describe().workers[0].host
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from contract import metadata
from contract.job import Job, check_run_id, new_run_id
from contract.layout import LOCAL_CHECKPOINTS
from infra import cleanup, naming
from infra.builtin_job import builtin
from infra.bundle_archive import build_bundle
from localpod import env_seed, pod_compute, procs
from localpod.gcp import (
    compute_client,
    iam_policy,
    secret_manager,
    storage,
    storage_faults,
    tokens,
    tpu_client,
)
from localpod.gcp.authz import POLICY_FILE
from localpod.gcp.identities import operator_token
from localpod.pod_tpu import TpuAnswers
from localpod.state import (
    PROJECT_ROOT,
    PodError,
    PodNotUp,
    PodPaths,
    SliceState,
    default_pod_dir,
    read_json,
    write_json,
)
from localpod.vm import memory
from localpod.vm.environment import accelerator_type, pod_metadata
from localpod.vm.metadata_server import CLOUD_PLATFORM, PROJECT_ID, ZONES

DEFAULT_TRAINER_ARGS = "--config tiny --steps 200"
DEFAULT_BUCKET = "tpupod-local"
STACK = "local"
DELETE_OWNED_TIMEOUT_S = 120.0  # `local down`: the slice's delete takes seconds here


@dataclass(frozen=True)
class WorkerInfo:
    index: int
    host: str
    port: int
    user: str
    key_filename: str
    agent_pid: int | None = None
    alive: bool = False
    hostname: str | None = None  # the instance name (guest attribute `hostname`)


@dataclass(frozen=True)
class PodInfo:
    state: SliceState
    health: str | None = None
    detail: str | None = None
    preempted: bool = False
    workers: list[WorkerInfo] = field(default_factory=list)
    pod: dict = field(default_factory=dict)  # pod.json: ports, pids, bucket, emulator_url, ...


class LocalPod(TpuAnswers):
    def __init__(
        self,
        pod_dir: Path | str | None = None,
        *,
        workers: int = 2,
        devices_per_worker: int = 2,
        startup_script: Path | str | None = None,
        trainer_args: str = DEFAULT_TRAINER_ARGS,
        job: Job | None = None,
        run_id: str | None = None,
        bucket: str = DEFAULT_BUCKET,
        stack: str = STACK,
        create_via: str = "queued",
        zones: tuple[str, ...] = ZONES,
        spot: bool = True,
        queue_first: bool = False,
        quota_chips: int | None = None,
        zone_quota_chips: int | None = None,
        iam_stack: str = iam_policy.DEFAULT_STACK,
        api: str = "tpu",
    ) -> None:
        """`startup_script`: a Path is read, a str is the script itself, None is
        contract.metadata.startup_script(); read once by `up` into the node spec. `job`: what the
        workers run (default: the built-in trainer's job with `trainer_args`); `run_id`: the
        run's id (default: a new run). `create_via` and `zones`: how recovery asks for the
        slice (the spec's `capacity`, as a stack's tpupod:createVia and tpupod:zones); `spot`:
        a spot node (else on-demand: host maintenance reboots it instead of ending it);
        `queue_first`: `up` files a queued resource too (else nodes.create, as `pulumi up`);
        `quota_chips`, `zone_quota_chips`: the TPU API's chip quota per region and per zone,
        each tier its own (localpod.gcp.tpu_quota; None: no limit). `iam_stack`: the stack whose IAM
        (identities, grants, enabled services) the pod's cloud enforces (localpod.gcp.iam_policy).
        `api`: `tpu` (a node through the Cloud TPU API) or `compute` (a managed instance group
        through Compute Engine: localpod.pod_compute; created directly, never queued)."""
        if api not in ("tpu", "compute"):
            raise PodError(f"api {api!r}: use tpu or compute")
        self.api = api
        if api == "compute":
            pod_compute.accelerator_for(workers)  # a shape Compute Engine makes, or one line
            create_via, queue_first = "direct", False
        self.paths = PodPaths(Path(pod_dir).resolve() if pod_dir else default_pod_dir())
        self.workers = workers
        self.devices_per_worker = devices_per_worker
        self.startup_script = startup_script
        self.trainer_args = trainer_args
        self.job = job or builtin(trainer_args)
        self.run_id = check_run_id(run_id) if run_id else new_run_id()
        self.bucket = bucket
        self.stack = stack
        self.capacity = {"via": create_via, "zones": list(zones)}
        self.spot = spot
        self.queue_first = queue_first and create_via == "queued"
        self.quota = {"region": quota_chips, "zone": zone_quota_chips}
        self.iam_stack = iam_stack
        self._controller: subprocess.Popen | None = None
        self._controller_start: int | None = None

    @property
    def run_prefix(self) -> str:
        """The run's directory as an object prefix of the pod's bucket (runs/local/<run id>)."""
        return metadata.run_dir(self.bucket, self.stack, self.run_id).split("/", 3)[3]

    # -- daemon ------------------------------------------------------------------------------
    def _pod(self) -> dict | None:
        return read_json(self.paths.pod)

    def _config(self) -> dict:
        return read_json(self.paths.config) or {}

    def is_up(self) -> bool:
        pod = self._pod()
        return bool(pod and procs.alive(pod["controller_pid"], pod["controller_start"]))

    def _live_pod(self) -> dict:
        pod = self._pod()
        if not pod or not procs.alive(pod["controller_pid"], pod["controller_start"]):
            raise PodNotUp(f"no local pod is up in {self.paths.root} (run `tpupod local up`)")
        return pod

    def endpoints(self) -> dict:
        """endpoints.json: what a client of this pod's cloud needs (Contract 1)."""
        self._live_pod()
        found = read_json(self.paths.endpoints)
        if found is None:
            raise PodNotUp(f"the local pod in {self.paths.root} has no {self.paths.endpoints}")
        return found

    def _request(self, method: str, path: str, timeout: float = 10.0) -> dict:
        pod = self._live_pod()
        url = f"http://127.0.0.1:{pod['control_port']}{path}"
        request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raise PodError(json.loads(err.read() or b"{}").get("error", str(err))) from None
        except (urllib.error.URLError, OSError) as err:
            raise PodNotUp(
                f"local pod controller in {self.paths.root} not answering: {err}"
            ) from None

    def up(self, timeout: float = 180.0, progress: Callable[[str], None] | None = None) -> PodInfo:
        """Start the controller, create the slice, return once it is READY; clean up on failure.
        One `up` at a time per pod directory: a second is refused at once, in one line."""
        self.paths.root.mkdir(parents=True, exist_ok=True)
        with open(self.paths.root / "up.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PodError(f"another `tpupod local up` is starting the pod in {self.paths.root}; "
                               "wait for it, or `tpupod local down`") from None  # fmt: skip
            return self._up(timeout, progress)

    def _up(self, timeout: float, progress: Callable[[str], None] | None) -> PodInfo:
        note = progress or (lambda _msg: None)
        if self.is_up():
            pod = self._pod() or {}
            raise PodError(f"a local pod is already up in {self.paths.root} (controller pid "
                           f"{pod.get('controller_pid')}, run {self._config().get('run_id')}): "
                           "`tpupod local down` first")  # fmt: skip
        self.down()  # leftovers of a pod whose controller died
        memory.sweep_orphans()  # and the memory of pods whose test bed died before `down`
        self.paths.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.paths.storage, ignore_errors=True)  # a fresh bucket per pod
        note(f"reading stack {self.iam_stack}'s IAM (identities, grants, services)")
        self._write_policy()
        script = self.startup_script
        write_json(
            self.paths.config,
            {
                "workers": self.workers,
                "devices_per_worker": self.devices_per_worker,
                "job": self.job.source,
                "run_id": self.run_id,
                "bucket": self.bucket,
                "stack": self.stack,
                "quota": self.quota,
                "api": self.api,
            },
        )
        try:
            note("starting controller, storage emulator, metadata server, TPU API")
            self._start_controller(deadline=time.monotonic() + timeout)
            note("uploading the code bundle, writing the node spec")
            self._write_spec(script)
            note(f"creating a {self.workers}-worker node")
            return self.create(wait=True, timeout=timeout)
        except BaseException:
            self.down()
            raise

    def _write_policy(self) -> iam_policy.Policy:
        """The IAM the pod's cloud enforces: the stack's, as `pulumi up` would leave it, and a
        new token key (tokens of an earlier pod are worthless here)."""
        shutil.rmtree(self.paths.root / "iam", ignore_errors=True)
        tokens.new_key(self.paths.root)
        secrets = tuple(sorted(set(self.job.spec.secrets.values())))
        policy = iam_policy.load(self.iam_stack, self.stack, PROJECT_ID, self.bucket, secrets)
        write_json(self.paths.root / POLICY_FILE, policy.to_json())
        return policy

    def _start_controller(self, deadline: float) -> None:
        # The pod's machinery (controller, emulator, and the worker agents it starts at every
        # re-creation) keeps its bytecode like any Python program: with the operator's
        # PYTHONDONTWRITEBYTECODE each VM boot would compile the agent's imports afresh (~0.4 s).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        with self.paths.controller_log.open("wb") as log:
            self._controller = subprocess.Popen(
                [sys.executable, "-m", "localpod.controller", str(self.paths.root)],
                cwd=PROJECT_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._controller_start = procs.start_time(self._controller.pid)
        while (pod := self._pod()) is None or pod.get("controller_pid") != self._controller.pid:
            if self._controller.poll() is not None or time.monotonic() > deadline:
                lines = self.paths.controller_log.read_text().strip().splitlines() or ["no output"]
                raise PodError(f"pod controller failed: {lines[-1]} ({self.paths.controller_log})")
            time.sleep(0.05)

    def _write_spec(self, script: Path | str | None) -> dict:
        """Upload the bundle and write node-spec.json: what `pulumi up` does on GCP."""
        pod = self._live_pod()
        bundle = build_bundle(job=self.job)
        token = operator_token(self.endpoints())  # `pulumi up` runs as the operator
        storage.upload_bundle(pod["emulator_url"], self.bucket, bundle, token)
        env_seed.plant(pod["emulator_url"], self.bucket, token=token)
        if isinstance(script, Path):
            script = script.read_text()
        elif script is None:
            try:
                script = metadata.startup_script()
            except FileNotFoundError:
                raise PodError(f"{metadata.STARTUP_SCRIPT_PATH} is missing") from None
        node_metadata = pod_metadata(
            bucket=self.bucket,
            bundle_object=bundle.object_name,
            bundle_sha256=bundle.sha256,
            stack=self.stack,
            job_json=self.job.spec.to_json(),
            run_id=self.run_id,
            coordinator_port=pod["coordinator_port"],
            script=script,
        )
        endpoints = self.endpoints()
        if self.api == "compute":
            spec = pod_compute.compute_spec(
                endpoints=endpoints, node_metadata=node_metadata, workers=self.workers,
                spot=self.spot, labels=naming.owner_labels(self.stack, self.run_id),
                account=self._policy().accounts["workers"], zones=self.capacity["zones"],
            )  # fmt: skip
            write_json(self.paths.node_spec, spec)
            return spec
        spec = {
            "capacity": self.capacity,
            "parent": f"projects/{endpoints['project']}/locations/{endpoints['zone']}",
            "node_id": endpoints["node"],
            "node": {
                "acceleratorType": accelerator_type(self.workers, self.devices_per_worker),
                "runtimeVersion": "tpu-ubuntu2204-base",
                "schedulingConfig": {"spot": True} if self.spot else {},
                "labels": naming.owner_labels(self.stack, self.run_id),
                "metadata": node_metadata,
                "serviceAccount": {
                    "email": self._policy().accounts["workers"],
                    "scope": [CLOUD_PLATFORM],
                },  # fmt: skip
            },
        }
        write_json(self.paths.node_spec, spec)
        return spec

    def delete_owned(self, timeout: float = DELETE_OWNED_TIMEOUT_S) -> cleanup.Removal:
        """What the stack's before_delete hook does at `pulumi destroy --run-program`: every node
        and queued resource labelled with the pod's stack, in each zone, deleted through the TPU
        API as the operator. The watcher VM stops first, as `pulumi destroy` deletes it before
        the slice: it would re-create what this deletes."""
        from localpod.vm import watcher_vm

        watcher_vm.stop(self.paths.root)
        stack = self._config().get("stack", self.stack)
        spec = read_json(self.paths.node_spec) or {}
        removal = tpu_client.delete_owned(self.endpoints(), stack, ZONES, timeout)
        if spec.get("api") == "compute":  # the group, wherever recovery moved it
            groups = compute_client.delete_owned(self.endpoints(), spec, ZONES, timeout)
            removal = cleanup.Removal(groups.deleted + removal.deleted, where="the pod's cloud")
        return removal

    def _policy(self) -> iam_policy.Policy:
        return iam_policy.Policy.from_json(read_json(self.paths.root / POLICY_FILE) or {})

    def down(self) -> bool:
        """Stop everything the pod started, by pid; True when something was running."""
        from localpod.vm import watcher_vm

        watcher_vm.stop(self.paths.root)  # `local up --watcher`: the watcher VM goes first
        pod = self._pod()
        if pod and env_seed.seed_dir() is not None:
            with contextlib.suppress(OSError, ValueError, KeyError, PodError):  # no emulator
                token = operator_token(read_json(self.paths.endpoints) or {})
                env_seed.harvest(pod["emulator_url"], pod.get("bucket", self.bucket), token)
        controllers = []
        if pod:
            controllers.append((pod["controller_pid"], pod["controller_start"]))
        if self._controller is not None:  # ours, maybe still starting (no pod.json yet)
            controllers.append((self._controller.pid, self._controller_start))
        running = {(pid, start) for pid, start in controllers if procs.alive(pid, start)}
        for pid, _ in running:
            os.kill(pid, signal.SIGTERM)  # the controller stops its children, then exits
        for pid, start in running:
            if not procs.wait_gone(pid, start, timeout=30):
                procs.kill_tree(pid, include_root=True)
        if pod:
            self._kill_leftovers(pod)
        if self._controller is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._controller.wait(timeout=5)
            self._controller = None
        self.paths.pod.unlink(missing_ok=True)
        memory.release(self.paths.root)  # the workers' /dev/shm: nothing runs to use it now
        return bool(pod or running)

    def _kill_leftovers(self, pod: dict) -> None:
        """What a controller that died without cleaning up left behind (agents re-parented to
        init take their whole worker with them)."""
        if procs.alive(pod["emulator_pid"], pod["emulator_start"]):
            procs.kill_tree(pod["emulator_pid"], include_root=True)
        for ready in self.paths.root.glob("workers/*/ready"):
            with contextlib.suppress(ValueError, OSError):
                agent = int(ready.read_text())
                cmdline = Path(f"/proc/{agent}/cmdline").read_bytes()
                if str(ready.with_name("agent.json")).encode() in cmdline:
                    procs.kill_tree(agent, include_root=True)

    # -- slice -------------------------------------------------------------------------------
    def describe(self) -> PodInfo:
        return _info(self._request("GET", "/describe", timeout=5))

    def wait_for(self, states: set[SliceState], timeout: float) -> PodInfo:
        deadline = time.monotonic() + timeout
        while (info := self.describe()).state not in states:
            if time.monotonic() > deadline:
                raise PodError(f"slice still {info.state} after {timeout:.0f} s")
            time.sleep(0.1)
        return info

    def create(self, wait: bool = True, timeout: float = 180.0) -> PodInfo:
        """The node from node-spec.json, through the TPU API like any client: nodes.create, as
        `pulumi up`'s V2Vm does, or a queued resource (`queue_first`, `tpupod local up`'s
        default), as recovery files one."""
        spec = read_json(self.paths.node_spec)
        if spec is None:
            raise PodError(f"no node spec {self.paths.node_spec}: run `tpupod local up`")
        if spec.get("api") == "compute":
            pod_compute.create(self.endpoints(), spec, timeout=timeout if wait else None)
            return self.describe()
        make = tpu_client.create_queued if self.queue_first else tpu_client.create_node
        make(self.endpoints(), spec, timeout=timeout if wait else None)
        return self.describe()

    def delete(self, wait: bool = True, timeout: float = 60.0) -> PodInfo:
        """nodes.delete of whichever node exists, through the TPU API (the group, through
        Compute Engine, on that path)."""
        spec = read_json(self.paths.node_spec) or {}
        if spec.get("api") == "compute":
            pod_compute.delete(self.endpoints(), spec, timeout=timeout if wait else None)
            return self.describe()
        tpu_client.delete_node(self.endpoints(), timeout=timeout if wait else None)
        return self.describe()

    def package_index(self, reachable: bool) -> None:
        """Whether workers booted from now on can reach PyPI and GitHub (HTTPS); the bucket and
        the metadata server stay reachable, as through Private Google Access without NAT."""
        if reachable:
            self.paths.registry_unreachable.unlink(missing_ok=True)
        else:
            self.paths.root.mkdir(parents=True, exist_ok=True)
            self.paths.registry_unreachable.touch()

    def set_secret(self, name: str, data: bytes) -> None:
        """A secret the pod's Secret Manager serves (localpod.gcp.secret_manager), up or not."""
        secret_manager.write_secret(self.paths.root / "secrets", name, data)

    def storage_faults(self, plan: dict | None = None) -> dict:
        """The bucket's injected faults (localpod.gcp.storage_faults): the report, after replacing
        the plan when one is given."""
        url = self._live_pod()["emulator_url"] + storage_faults.CONTROL_PATH
        data = json.dumps(plan).encode() if plan is not None else None
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as err:
            reason = (json.loads(err.read() or b"{}").get("error") or {}).get("message", err)
            raise PodError(f"storage faults: {reason}") from None
        except (urllib.error.URLError, OSError) as err:
            raise PodNotUp(f"the local pod's storage emulator is not answering: {err}") from None

    def recreate(self, wait: bool = True) -> PodInfo:
        if self.describe().state != SliceState.MISSING:
            self.delete(wait=True)
        return self.create(wait=wait)

    def preempt(self, notice: float = 0.0, wait: bool = True) -> PodInfo:
        info = _info(self._request("POST", f"/preempt?notice={notice}"))
        return self.wait_for({SliceState.PREEMPTED}, notice + 30) if wait else info

    def maintenance(self, seconds: float = 5.0, wait: bool = True) -> PodInfo:
        """GCE host maintenance (localpod.vm.slice.Slice.maintain): an on-demand node reboots after
        `seconds` with its disk, a spot node is preempted. Waits until READY and HEALTHY again."""
        self._request("POST", f"/maintenance?seconds={seconds}")
        if not wait:
            return self.describe()
        if self.describe().preempted:  # a spot node: maintenance ended it
            return self.wait_for({SliceState.PREEMPTED}, 60)
        deadline = time.monotonic() + seconds + 60
        while (info := self.describe()).health != "HEALTHY" or info.state is not SliceState.READY:
            if time.monotonic() > deadline or info.state is not SliceState.READY:
                raise PodError(f"slice {info.state} ({info.health}) after maintenance")
            time.sleep(0.1)
        return info

    def crash(self, worker: int) -> int:
        """SIGKILL the job's process group on `worker` (the group of the pid in
        $TPUPOD_ROOT/job.pid), whatever the job is; returns that pid."""
        return self._request("POST", f"/crash?worker={worker}")["pid"]

    def lose_local_checkpoints(self, worker: int) -> None:
        """`worker`'s local tier gone (tpupod_job.local_tier: its copies of recent steps on its
        own disk); the bucket's checkpoints stay."""
        shutil.rmtree(self.paths.tpupod_root(worker) / LOCAL_CHECKPOINTS, ignore_errors=True)

    def hang(self, worker: int) -> int:
        """SIGSTOP the job's process group on `worker`; returns its leader's pid."""
        return self._request("POST", f"/hang?worker={worker}")["pid"]

    def kill_when(
        self, worker: int, state: str, delay: float = 0.3, same_process: bool = False
    ) -> dict:
        """Arm a SIGKILL of `worker`'s job for when a new job process's status (or, with
        `same_process`, the running one's) first says `state` (plus `delay` s):
        localpod.timed_kills. Returns the armed record."""
        query = f"worker={worker}&state={state}&delay={delay}&same_process={int(same_process)}"
        return self._request("POST", f"/kill-when?{query}")["armed"]

    def timed_kills(self) -> list[dict]:
        """Every kill armed by `kill_when`, and what each one found when it fired."""
        return self._request("GET", "/kills")["kills"]

    def __enter__(self) -> LocalPod:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()


def _info(raw: dict) -> PodInfo:
    names = [i["hostname"] for i in raw.get("instances", [])]
    return PodInfo(
        state=SliceState.parse(raw["state"]),
        health=raw.get("health"),
        detail=raw.get("detail"),
        preempted=bool(raw.get("preempted")),
        workers=[
            WorkerInfo(**w, hostname=names[w["index"]] if w["index"] < len(names) else None)
            for w in raw.get("workers", [])
        ],
        pod=raw.get("pod") or {},
    )
