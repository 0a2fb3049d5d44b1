"""The pod controller daemon: `python -m localpod.controller POD_DIR`.

One long-lived process owns everything a pod runs (the emulator, the metadata server, the Cloud
TPU API, the worker agents) so that separate CLI calls share one pod and `down` has one thing to
stop. It is a child subreaper too: orphans of a worker agent that died come back to it and are
cleaned up. Clients create and delete the node through the TPU API (`endpoints.json` says where);
the pod-only calls (describe, faults, stockout, shutdown) are a loopback JSON control API whose
client is `localpod.pod.LocalPod`.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from localpod import procs
from localpod.gcp import identities, oslogin, secret_manager, storage, tokens, tpu_control
from localpod.gcp.authz import POLICY_FILE, Gate
from localpod.gcp.compute_api import ComputeApiServer
from localpod.gcp.compute_kept import REGION
from localpod.gcp.compute_service import ComputeService
from localpod.gcp.iam_policy import OPERATOR
from localpod.gcp.loopback import send_json
from localpod.gcp.tpu_api import TpuApiServer
from localpod.gcp.tpu_nodes import TpuService
from localpod.gcp.tpu_quota import Quota
from localpod.state import PodError, PodPaths, read_json, write_json
from localpod.timed_kills import TimedKills
from localpod.vm import trash
from localpod.vm.metadata_server import PROJECT_ID, ZONE, MetadataServer, MetadataStore
from localpod.vm.privilege import login_user
from localpod.vm.slice import Slice
from localpod.vm.worker_vm import write_ed25519_key

UPKEEP_INTERVAL_S = 0.25
WATCHER_OCTET = 200  # the watcher VM's address in the pod's 127.0.K.0/24 (localpod.vm.watcher_vm)
NODE_ID = "local"  # the node the pod's own `up` creates


def _log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}", flush=True)


def choose_subnet(pod_dir: Path) -> int:
    """A 127.0.K.0/24 with no listener yet; the search starts at a hash of the pod dir."""
    taken = {int(ip.split(".")[2]) for ip, _ in procs.listening() if ip.startswith("127.0.")}
    start = zlib.crc32(str(pod_dir).encode()) % 250
    for step in range(250):
        k = 2 + (start + step) % 250
        if k not in taken:
            return k
    raise PodError("no free 127.0.K.0/24 subnet for the pod")


def choose_layout(paths: PodPaths, config: dict) -> dict:
    k = choose_subnet(paths.root)
    addresses = [f"127.0.{k}.{i + 1}" for i in range(config["workers"])]
    watcher_address = f"127.0.{k}.{WATCHER_OCTET}"
    # JAX's coordinator binds all addresses, so its port must be no other service's; the storage
    # emulator listens on every VM's address and 127.0.0.1, so its port is held on all of them.
    with procs.held_ports(["0.0.0.0", "0.0.0.0", *addresses]) as held:
        metadata_port = procs.free_port_on_all(addresses)  # none of the held ones
    coordinator_port, emulator_port, *ssh_ports = held
    return {
        "subnet": k,
        "addresses": addresses,
        "watcher_address": watcher_address,
        "ssh_ports": ssh_ports,
        "metadata_port": metadata_port,
        "coordinator_port": coordinator_port,
        "emulator_port": emulator_port,
        "emulator_url": f"http://127.0.0.1:{emulator_port}",
        "user": login_user(),
        "devices_per_worker": config["devices_per_worker"],
    }


class Controller:
    def __init__(self, paths: PodPaths, config: dict) -> None:
        self.paths = paths
        self.config = config
        self.stop = threading.Event()
        self.layout = choose_layout(paths, config)
        self.emulator = None
        self.metadata: MetadataServer | None = None
        self.api: ThreadingHTTPServer | None = None
        self.tpu: TpuApiServer | None = None
        self.compute: ComputeApiServer | None = None
        self.slice: Slice | None = None
        self.reaper: trash.Reaper | None = None  # old disks and stopped VMs' memory
        self.kills: TimedKills | None = None
        self.oslogin: oslogin.OsLoginServer | None = None
        self.secrets: secret_manager.SecretManagerServer | None = None
        self.gate: Gate | None = None

    def kill_strays(self) -> None:
        """Kill our descendants that are neither the emulator's tree, a live worker agent's nor
        the trash reaper's rm."""
        keep = {self.emulator.pid} if self.emulator else set()
        keep |= self.slice.agent_pids() if self.slice else set()
        keep |= self.reaper.pids() if self.reaper else set()
        everything = procs.all_procs()
        kept = set(keep)
        for pid in keep:
            kept |= {p.pid for p in procs.descendants(pid, everything)}
        strays = [p for p in procs.descendants(os.getpid(), everything) if p.pid not in kept]
        procs.send(strays, signal.SIGKILL)

    def _start_emulator(self, bucket: str) -> None:
        self.emulator = storage.start_emulator(
            self.layout["emulator_port"], bucket, self.paths.storage, self.paths.emulator_log,
            pod_dir=self.paths.root, listeners=storage_listeners(self.layout, self.gate.policy),
        )  # fmt: skip

    def _emulator_ready(self, bucket: str, operator: str) -> None:
        """Until the bucket answers. The emulator's port was held, then released for it to bind:
        one another process took in between ends the emulator at once, and it starts again on a
        port picked anew, none of the pod's others (the workers, booted after this, read the
        layout's port)."""
        others = {self.layout["coordinator_port"], self.layout["metadata_port"],
                  *self.layout["ssh_ports"]}  # fmt: skip

        def start(port: int):
            self.layout.update(emulator_port=port, emulator_url=f"http://127.0.0.1:{port}")
            self._start_emulator(bucket)
            return self.emulator

        def pick() -> int:
            while (port := procs.free_port("0.0.0.0")) in others:  # free on every address
                pass
            return port

        def wait(proc, port: int) -> None:
            storage.wait_ready(proc, f"http://127.0.0.1:{port}", bucket, token=operator)

        storage.ready_on_a_free_port(self.emulator, self.layout["emulator_port"], start, wait, pick)

    def start(self) -> None:
        if not self.paths.client_key.exists():  # the operator's key, kept across pods
            write_ed25519_key(self.paths.client_key, comment="tpupod-local")
        bucket = self.config["bucket"]
        self.gate = Gate.for_pod(self.paths.root)
        if self.gate is None:
            raise PodError(f"no IAM policy in {self.paths.root / POLICY_FILE}: `up` writes it")
        key = tokens.read_key(self.paths.root)
        self._start_emulator(bucket)
        store = MetadataStore(token_key=key)
        self.metadata = MetadataServer(
            self.layout["addresses"], self.layout["metadata_port"], store
        )
        self.metadata.start()
        self.slice = Slice(self.paths, self.layout, store, self.kill_strays)
        self.reaper = trash.Reaper(self.paths).start()
        self.kills = TimedKills(lambda i: self.paths.tpupod_root(i) / "status.json",
                                self.slice.signal_job)  # fmt: skip
        quota = Quota(**self.config.get("quota", {}))  # chips per region and per zone, per tier
        self.tpu = TpuApiServer(TpuService(self.slice, self.layout, quota), self.gate)
        self.tpu.start()
        # Compute Engine's subset, on the same slice (and the same injected stockouts).
        compute = ComputeService(self.slice, self.layout, self.tpu.service.faults)
        self.compute = ComputeApiServer(compute, self.gate)
        self.compute.start()
        # OS Login: keys imported here are what the workers' SSH servers (spawned after this,
        # inheriting the variable) accept for a service account's POSIX user.
        os.environ[oslogin.DIR_ENV] = str(self.paths.root / "oslogin")
        self.oslogin = oslogin.OsLoginServer(self.paths.root / "oslogin", self.gate)
        self.oslogin.start()
        # Secret Manager: the workers (booted after this) reach it through their environment.
        self.secrets = secret_manager.SecretManagerServer(self.paths.root / "secrets", self.gate)
        self.secrets.start()
        self.layout["secretmanager_url"] = self.secrets.url
        self.api = ThreadingHTTPServer(("127.0.0.1", 0), _ApiHandler)
        self.api.daemon_threads = True
        self.api.controller = self  # type: ignore[attr-defined]
        threading.Thread(target=self.api.serve_forever, kwargs={"poll_interval": 0.2}).start()
        operator = tokens.mint(key, OPERATOR.split(":", 1)[1])  # the bucket's owner asks
        self._emulator_ready(bucket, operator)
        pod = {
            **self.layout,
            "pod_dir": str(self.paths.root),
            "control_port": self.api.server_address[1],
            "tpu_api": self.tpu.url,
            "node": NODE_ID,
            "controller_pid": os.getpid(),
            "controller_start": procs.start_time(os.getpid()),
            "emulator_pid": self.emulator.pid,
            "emulator_start": procs.start_time(self.emulator.pid),
            "bucket": bucket,
            "stack": self.config["stack"],
            "client_key": str(self.paths.client_key),
        }
        published = endpoints(self.paths, self.layout, self.tpu.url, bucket)
        published |= compute_endpoints(self.compute.url, self.config.get("api"))
        published["oslogin"] = self.oslogin.url  # like https://oslogin.googleapis.com
        published["secretmanager"] = self.secrets.url  # like https://secretmanager.googleapis.com
        published["identities"] = identities.for_pod(self.paths.root, key, self.gate.policy,
                                                     len(self.layout["addresses"]))  # fmt: skip
        write_json(self.paths.endpoints, published)
        write_json(self.paths.pod, pod)
        _log(f"pod up: control 127.0.0.1:{pod['control_port']}, TPU API {self.tpu.url}")

    def run(self) -> None:
        while not self.stop.wait(UPKEEP_INTERVAL_S):
            self.slice.check_agents()
            keep = {self.emulator.pid} | self.slice.agent_pids() | self.reaper.pids()
            procs.reap_zombies(skip=keep)

    def close(self) -> None:
        """Everything this process started, stopped by pid; safe after a partial start."""
        _log("shutting down")
        if self.slice:
            self.slice.shutdown()
        if self.api:
            self.api.shutdown()
            self.api.server_close()
        if self.tpu:
            self.tpu.stop()
        for server in (self.compute, self.oslogin, self.secrets):
            if server is not None:
                server.stop()
        if self.metadata:
            self.metadata.stop()
        if self.emulator and self.emulator.poll() is None:
            procs.kill_tree(self.emulator.pid, include_root=False, grace=0)
            self.emulator.terminate()
            try:
                self.emulator.wait(timeout=5)
            except Exception:  # noqa: BLE001 - last resort below
                self.emulator.kill()
                self.emulator.wait(timeout=5)
        self.kill_strays()
        if self.reaper:  # after the workers: what is left goes to one detached rm
            self.reaper.stop()
        _log("stopped")
        pod = read_json(self.paths.pod)
        if pod and pod.get("controller_pid") == os.getpid():
            self.paths.pod.unlink(missing_ok=True)
            self.paths.endpoints.unlink(missing_ok=True)


def storage_url(layout: dict, address: str) -> str:
    """A VM's own storage URL: its address, the emulator's port (localpod.gcp.storage_iam)."""
    return f"http://{address}:{layout['emulator_port']}"


def storage_listeners(layout: dict, policy) -> dict[str, str]:
    """Each machine's address -> the member its token-less storage requests are attributed to:
    every VM's, and 127.0.0.1 the operator's (whose emulator-mode clients send no token either:
    Orbax's own google-cloud-storage client, gcsfs `anon`)."""
    listeners = {"127.0.0.1": OPERATOR}
    listeners |= {a: f"serviceAccount:{policy.accounts['workers']}" for a in layout["addresses"]}
    if "watcher" in policy.accounts:
        listeners[layout["watcher_address"]] = f"serviceAccount:{policy.accounts['watcher']}"
    return listeners


def endpoints(paths: PodPaths, layout: dict, tpu_api: str, bucket: str) -> dict:
    """What a client of the pod's cloud needs (endpoints.json; `tpupod local endpoints`)."""
    iap = [sys.executable, "-m", "localpod.vm.iap"]
    tail = ["--endpoints", str(paths.endpoints)]
    return {
        "tpu_api": tpu_api,
        "project": PROJECT_ID,
        "zone": ZONE,
        "node": NODE_ID,
        "storage": layout["emulator_url"],
        "bucket": bucket,
        "spec_file": str(paths.node_spec),
        "ssh": {
            "user": layout["user"],
            "key_file": str(paths.client_key),
            "known_hosts": str(paths.known_hosts),
            "iap_command": shlex.join(iap)
            + " {instance} 22 --listen-on-stdin --zone {zone} --project {project} "
            + shlex.join(tail),
            "ports": dict(zip(layout["addresses"], layout["ssh_ports"], strict=True)),
        },
    }


def compute_endpoints(compute_api: str, api: str | None) -> dict:
    """The Compute Engine API's root (what gcloud's `api_endpoint_overrides/compute` takes) and
    the zone's region; with `--api compute`, the names of the group and its workload policy."""
    found = {"compute_api": compute_api, "region": REGION}
    if api == "compute":
        found |= {"mig": NODE_ID, "workload_policy": f"{NODE_ID}-topology"}
    return found


class _ApiHandler(BaseHTTPRequestHandler):
    """describe, kills (GET); preempt / maintenance / crash / hang / kill-when / shutdown and
    the TPU API's injections, quota and answers (POST). Nodes are created and deleted through
    the TPU API."""

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass

    def _reply(self, code: int, payload: dict) -> None:
        send_json(self, code, payload)  # the one JSON answer every local API sends

    def do_GET(self) -> None:  # noqa: N802
        ctl: Controller = self.server.controller  # type: ignore[attr-defined]
        if urlsplit(self.path).path == "/describe":
            return self._reply(200, {**ctl.slice.describe(), "pod": read_json(ctl.paths.pod)})
        if urlsplit(self.path).path == "/kills":
            return self._reply(200, {"kills": ctl.kills.report()})
        self._reply(404, {"error": f"no such endpoint {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        ctl: Controller = self.server.controller  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        actions = {
            **tpu_control.actions(ctl.tpu.service, query),
            "/preempt": lambda: ctl.slice.preempt(float(query.get("notice", "0"))),
            "/maintenance": lambda: ctl.slice.maintain(float(query.get("seconds", "5"))),
            "/crash": lambda: {"pid": ctl.slice.signal_job(int(query["worker"]), signal.SIGKILL)},
            "/hang": lambda: {"pid": ctl.slice.signal_job(int(query["worker"]), signal.SIGSTOP)},
            "/kill-when": lambda: {
                "armed": ctl.kills.arm(
                    int(query["worker"]),
                    query["state"],
                    float(query.get("delay", "0.3")),
                    same_process=query.get("same_process") == "1",
                )
            },
            "/shutdown": ctl.stop.set,
        }
        action = actions.get(url.path)
        if action is None:
            return self._reply(404, {"error": f"no such endpoint {url.path}"})
        try:
            result = action() or {}
        except (PodError, KeyError, ValueError, OSError) as err:
            return self._reply(409, {"error": str(err)})
        self._reply(200, {**result, **ctl.slice.describe()})


def main(pod_dir: str) -> int:
    paths = PodPaths(Path(pod_dir).resolve())
    config = read_json(paths.config)
    if config is None:
        print(f"controller: no {paths.config}", file=sys.stderr)
        return 2
    procs.set_subreaper()
    controller = Controller(paths, config)
    signal.signal(signal.SIGTERM, lambda *_: controller.stop.set())
    signal.signal(signal.SIGINT, lambda *_: controller.stop.set())
    try:
        controller.start()
        controller.run()
    except Exception as err:  # noqa: BLE001 - logged for `up` to report in one line
        _log(f"error: {type(err).__name__}: {err}")
        return 1
    finally:
        controller.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
