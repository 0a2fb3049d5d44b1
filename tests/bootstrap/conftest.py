"""A bare slice for the bootstrap failure tests and measure_boot: the local pod's metadata
server, bucket and worker environment, without agents or SSH.

Each worker is a directory ($TPUPOD_ROOT) and a metadata listener on its own loopback address;
"booting" a worker runs the real startup-script from its metadata, as the guest agent does.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from contract import metadata
from infra.builtin_job import builtin
from infra.bundle_archive import BUNDLE_PATHS, PROJECT_ROOT, Bundle, build_bundle
from localpod import env_seed, procs
from localpod.gcp import storage
from localpod.vm.environment import image_bin, worker_env
from localpod.vm.metadata_server import MetadataServer, MetadataStore

BUCKET = "tpupod-local-ckpt"
STACK = "local"
# Long enough to outlive every test that expects a running trainer; teardown stops it.
TRAINER_ARGS = "--config tiny --steps 100000"
RUN_ID = "r1"


def job_json(trainer_args: str = TRAINER_ARGS) -> str:
    """The `tpupod-job` metadata of the built-in trainer's job with these arguments."""
    return builtin(trainer_args).spec.to_json()


def stage_bundle_root(dest: Path, marker: str = "") -> Path:
    """A copy of what the bundle holds; `marker` changes the bytes (and so the hash) only."""
    for name in BUNDLE_PATHS:
        src = PROJECT_ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            shutil.copy2(src, dest / name)
    if marker:
        with (dest / "README.md").open("a") as f:
            f.write(f"\n<!-- bundle marker {marker} -->\n")
    return dest


@dataclass
class BootResult:
    returncode: int
    output: str
    seconds: float


@dataclass
class Slice:
    tmp: Path
    addresses: list[str]
    store: MetadataStore
    metadata_port: int
    storage_url: str
    attributes: list[dict[str, str]] = field(default_factory=list)
    running: list[subprocess.Popen] = field(default_factory=list)
    bucket: str = BUCKET
    stack: str = STACK
    carry_environments: bool = True  # to the session's seed (localpod.env_seed), at the end

    def root(self, index: int) -> Path:
        return self.tmp / f"worker-{index}"

    def publish(self, bundle: Bundle, **overrides: str | None) -> None:
        """Upload `bundle` and set every worker's metadata for it; None drops a key."""
        storage.upload_bundle(self.storage_url, BUCKET, bundle)
        port = procs.free_port(self.addresses[0])
        common = metadata.worker_metadata(
            bucket=BUCKET,
            bundle_object=bundle.object_name,
            bundle_sha256=bundle.sha256,
            stack=STACK,
            job_json=job_json(TRAINER_ARGS),
            run_id=RUN_ID,
            uv_group="",
            coordinator_port=port,
        )
        common[metadata.WORKER_NETWORK_ENDPOINTS] = metadata.network_endpoints_value(self.addresses)
        common[metadata.ACCELERATOR_TYPE] = "v4-16"
        self.attributes = []
        for i in range(len(self.addresses)):
            attrs = {**common, metadata.AGENT_WORKER_NUMBER: str(i)}
            for key, value in overrides.items():
                key = key.replace("_", "-")
                if value is None:
                    attrs.pop(key, None)
                else:
                    attrs[key] = value
            self.attributes.append(attrs)
        self.store.set_attributes(
            dict(enumerate(self.attributes)),
            {i: f"worker-{i}" for i in range(len(self.addresses))},
        )

    def forget_environments(self) -> None:
        """An empty envs/ in the bucket: the next boot installs from the package index. What the
        test then puts there is its own: nothing is carried to the session's seed."""
        self.carry_environments = False
        for obj in storage.list_objects(self.storage_url, BUCKET, env_seed.PREFIX):
            storage.delete(self.storage_url, BUCKET, obj["name"])

    def memory(self, index: int) -> Path:
        """Worker `index`'s TPUPOD_RAM_DIR (the VM's tmpfs; here on the test's disk): a new VM's
        is empty, as its disk is."""
        return self.tmp / f"memory-{index}"

    def env(self, index: int) -> dict[str, str]:
        """The local pod's worker environment (cold: its own uv cache, on its own disk), a
        lockfile of the worker's own."""
        env = worker_env(
            home=self.tmp / f"home-{index}",
            image=image_bin(self.tmp),
            tpupod_root=self.root(index),
            metadata_host=f"{self.addresses[index]}:{self.metadata_port}",
            emulator_url=self.storage_url,
            devices_per_worker=1,
            memory_dir=self.memory(index),
        )
        env.update(
            TPUPOD_ROOT=str(self.root(index)),
            UV_CACHE_DIR=str(self.root(index) / ".uv-cache"),
            UV_PYTHON_INSTALL_DIR=str(self.root(index) / "python"),
            TPUPOD_STOP_TIMEOUT="30",
            TPUPOD_LIBTPU_LOCKFILE=str(self.root(index) / "libtpu_lockfile"),
        )
        return env

    def boot(self, indices: list[int] | None = None, **extra_env: str) -> list[BootResult]:
        """Run each worker's startup-script (from its metadata) at once; wait for all."""
        indices = list(range(len(self.addresses))) if indices is None else indices
        # Every script is written before any starts: bash reads its script as it runs, so
        # rewriting it for a second run of the same worker would truncate the first one's.
        for i in set(indices):
            self.root(i).mkdir(parents=True, exist_ok=True)
            (self.tmp / f"home-{i}").mkdir(exist_ok=True)
            script = self.tmp / f"startup-{i}.sh"
            script.write_text(self.attributes[i].get(metadata.STARTUP_SCRIPT, ""))
        started = []
        for i in indices:
            proc = subprocess.Popen(
                ["bash", str(self.tmp / f"startup-{i}.sh")],
                env={**self.env(i), **extra_env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=self.tmp / f"home-{i}",
                start_new_session=True,
            )
            self.running.append(proc)
            started.append((proc, time.monotonic()))
        results = []
        for proc, t0 in started:
            out, _ = proc.communicate(timeout=600)
            results.append(BootResult(proc.returncode, out, time.monotonic() - t0))
            self.running.remove(proc)
        return results

    def bootstrap(self, index: int) -> dict:
        return json.loads((self.root(index) / "bootstrap.json").read_text())

    def status(self, index: int) -> dict | None:
        try:
            return json.loads((self.root(index) / "status.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def job_pid(self, index: int) -> int | None:
        try:
            return int((self.root(index) / "job.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def wait_training(self, indices: list[int], timeout: float = 240.0, after_step: int = 0):
        """Until every worker's status file says training past `after_step`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = {i: self.status(i) for i in indices}
            if all(
                s and s["state"] == "training" and s["step"] > after_step for s in found.values()
            ):
                return found
            for i in indices:
                exit_file = self.root(i) / "job.exit"
                if exit_file.exists() and self.job_pid(i) is None:
                    log = (self.root(i) / "job.log").read_text()[-3000:]
                    raise AssertionError(f"worker {i} job exited {exit_file.read_text()}:\n{log}")
            time.sleep(0.2)
        logs = {i: (self.root(i) / "job.log").read_text()[-2000:] for i in indices}
        raise AssertionError(f"not training after {timeout:.0f}s: {found}\n{logs}")

    def jobctl(self, index: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        ctl = self.root(index) / "current" / "bootstrap" / "jobctl.sh"
        return subprocess.run(
            ["bash", str(ctl), *args],
            env=self.env(index),
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
        )

    def cleanup(self) -> None:
        """Stop what the tests started: bootstraps, then the trainers (all workers at once, as
        a multi-host job stops), then any process group jobctl left recorded."""
        for proc in self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        pids = {i: self.job_pid(i) for i in range(len(self.addresses))}
        stops = [
            subprocess.Popen(
                ["bash", str(self.root(i) / "current" / "bootstrap" / "jobctl.sh"), "stop"],
                env={**self.env(i), "TPUPOD_STOP_TIMEOUT": "10"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i, pid in pids.items()
            if pid and (self.root(i) / "current").exists()
        ]
        for stop in stops:
            stop.wait(timeout=60)
        for i, pid in pids.items():
            # Still recorded: the group our jobctl made (a group id is not reused while the
            # group has members).
            if pid and self.job_pid(i) == pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)


@contextlib.contextmanager
def _make_slice(tmp: Path, workers: int):
    subnet = random.randint(100, 250)
    addresses = [f"127.0.{subnet}.{i + 1}" for i in range(workers)]
    port = procs.free_port_on_all(addresses)
    store = MetadataStore()
    server = MetadataServer(addresses, port, store)
    server.start()
    started: list = []

    def start(p: int):
        started.append(storage.start_emulator(p, BUCKET, tmp / "gcs", tmp / "gcs.log"))
        return started[-1]

    def wait(proc, p: int) -> None:
        storage.wait_ready(proc, f"http://127.0.0.1:{p}", BUCKET)

    try:
        storage_port = procs.free_port("127.0.0.1")
        # another xdist worker may take the port between the pick and the bind: pick again
        storage_port = storage.ready_on_a_free_port(start(storage_port), storage_port, start, wait)
        storage_url = f"http://127.0.0.1:{storage_port}"
        env_seed.plant(storage_url, BUCKET)  # the session's environments (tests/conftest.py)
        made = Slice(tmp, addresses, store, port, storage_url)
        yield made
        if made.carry_environments:
            env_seed.harvest(storage_url, BUCKET)
    finally:
        for emulator in started:
            with contextlib.suppress(ProcessLookupError):  # one whose port was taken has exited
                os.killpg(emulator.pid, signal.SIGTERM)
            emulator.wait(timeout=10)
        server.stop()


@pytest.fixture
def single(tmp_path):
    """A one-worker slice of its own."""
    with _make_slice(tmp_path, 1) as made:
        try:
            yield made
        finally:
            made.cleanup()


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """Two bundles of the same code with different hashes."""
    tmp = tmp_path_factory.mktemp("bundles")
    return [build_bundle(stage_bundle_root(tmp / name, name)) for name in ("a", "b")]


@pytest.fixture
def stage():
    """stage(dest, marker="") -> dest: a copy of what the bundle holds, to edit and build."""
    return stage_bundle_root
