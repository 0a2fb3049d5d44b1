"""The slice a command acts on: which TPU API, which node, the spec to recreate it, how to SSH.

`--stack local` reads the local pod's `endpoints.json` (its TPU API on loopback; the operator's
token file, or on one of the pod's VMs its own service account: ops.cloud.credentials); any other stack is a Pulumi stack on GCP (Google's endpoint, ADC), whose outputs
are read once with `pulumi stack output --json` and cached beside the journal, or come from
`--spec FILE` on a machine without the Pulumi CLI. Recovery needs nothing else: no repo, no Pulumi.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from contract import metadata
from contract.job import JobSpec, spec_from_json
from ops.cloud.slice import ProviderError
from ops.json_file import write_atomic

ROOT = Path(__file__).resolve().parents[2]
LOCAL = "local"
POD_DIR_ENV = "TPUPOD_POD_DIR"
STATE_DIR_ENV = "TPUPOD_STATE_DIR"
# gcloud's own IAP tunnel, as `gcloud compute tpus tpu-vm ssh --tunnel-through-iap` opens it.
IAP_PROXY = (
    "gcloud compute start-iap-tunnel {instance} 22 --listen-on-stdin "
    "--zone {zone} --project {project} --verbosity warning"
)
VIAS = ("iap", "internal")
COMPUTE = "compute"  # a spec's `api` for a slice through Compute Engine (infra.mig_spec)
COMPUTE_KEYS = ("project", "zone", "region", "workload_policy", "template", "manager")
PULUMI_MISSING = (
    "the Pulumi CLI is not installed: install it (https://www.pulumi.com/docs/install/) and run "
    "`pulumi login`, or pass --spec FILE (the stack's `node_spec` output)"
)


@dataclass(frozen=True)
class SshSettings:
    user: str | None
    key_file: str | None
    via: str = "iap"  # "iap": ProxyCommand to the instance name; "internal": the internal IP
    iap_command: str = IAP_PROXY
    ports: dict[str, int] = field(default_factory=dict)  # internal IP -> port (local pod)


@dataclass(frozen=True)
class Target:
    stack: str
    project: str
    zone: str
    node: str
    spec: dict  # Contract 2: {"parent", "node_id", "node"}
    ssh: SshSettings
    api_endpoint: str | None = None  # None: Google's default endpoint
    token_file: str | None = None  # a bearer token to send (ops.cloud.credentials); None: ADC
    storage_endpoint: str | None = None  # the local pod's GCS emulator; None: Google's
    compute_endpoint: str | None = None  # the local pod's Compute Engine API; None: Google's

    @property
    def api(self) -> str:
        """Which API makes the slice: `compute` (a managed instance group) or `tpu` (a node)."""
        return COMPUTE if self.spec.get("api") == COMPUTE else "tpu"

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    @property
    def node_name(self) -> str:
        return f"{self.parent}/nodes/{self.node}"

    @property
    def capacity(self) -> dict:
        """How recovery asks for the slice (the spec's `capacity`, infra.node_spec): `via`
        queued (a queued resource) or direct (nodes.create), `zones` in order of preference,
        `valid_for_s` and `reservation` for a queued request. A spec from before has none:
        nodes.create in its one zone."""
        raw = dict(self.spec.get("capacity") or {})
        raw["via"] = raw.get("via") or "direct"
        zones = [str(z) for z in raw.get("zones") or [] if z]
        raw["zones"] = zones if self.zone in zones else [self.zone, *zones]
        return raw

    @property
    def metadata(self) -> dict[str, str]:
        """The slice's metadata as declared (tpupod's keys: contract.metadata)."""
        return spec_metadata(self.spec)

    def job(self) -> JobSpec | None:
        """The job the node runs (metadata `tpupod-job`); None for a spec that names none."""
        raw = self.metadata.get(metadata.JOB)
        if not raw:
            return None
        try:
            return spec_from_json(raw)
        except ValueError as err:
            raise ProviderError(
                f"node spec of {self.stack}: unreadable tpupod-job ({err})"
            ) from None


def spec_metadata(spec: dict) -> dict[str, str]:
    """A spec's metadata: the node's, or the instance template's (a Compute Engine spec)."""
    if spec.get("api") == COMPUTE:
        items = ((spec.get("template") or {}).get("properties") or {}).get("metadata")
        return {i["key"]: i.get("value", "") for i in (items or {}).get("items") or []}
    return dict((spec.get("node") or {}).get("metadata") or {})


def default_pod_dir() -> Path:
    return Path(os.environ.get(POD_DIR_ENV) or ROOT / ".tpupod").resolve()


def state_dir(stack: str) -> Path:
    """Where a stack's journal, incident and cached target live."""
    base = os.environ.get(STATE_DIR_ENV)
    return Path(base) / stack if base else ROOT / ".tpupod" / "ops" / stack


def known_stacks(root: Path = ROOT) -> list[str]:
    found = (
        p.name[len("Pulumi.") : -len(".yaml")] for p in (root / "stacks").glob("Pulumi.*.yaml")
    )
    return [LOCAL, *sorted(found)]


def load_target(
    stack: str,
    *,
    pod_dir: Path | None = None,
    spec_file: Path | None = None,
    cache_dir: Path | None = None,
) -> Target:
    if stack == LOCAL:
        return local_target(pod_dir or default_pod_dir())
    return gcp_target(stack, spec_file, cache_dir or state_dir(stack))


def _via() -> str:
    via = os.environ.get("TPUPOD_SSH_VIA", "iap")
    if via not in VIAS:
        raise ProviderError(f"TPUPOD_SSH_VIA={via!r}: use one of {', '.join(VIAS)}")
    return via


def local_target(pod_dir: Path) -> Target:
    path = Path(pod_dir) / "endpoints.json"
    if not path.is_file():
        raise ProviderError(f"no local pod is up in {pod_dir} (run `tpupod local up`)")
    try:
        ep = json.loads(path.read_text())
        ssh = ep["ssh"]
        spec = read_spec(Path(ep["spec_file"]))
        compute = spec.get("api") == COMPUTE
        return Target(
            stack=LOCAL,
            project=ep["project"],
            zone=spec["zone"] if compute else ep["zone"],
            node=spec["manager"]["name"] if compute else ep["node"],
            spec=spec,
            ssh=SshSettings(
                # the local watcher VM logs in as its OS Login user (ops.fleet.oslogin), like on GCP
                user=os.environ.get("TPUPOD_SSH_USER") or ssh["user"],
                key_file=os.environ.get("TPUPOD_SSH_KEY") or ssh["key_file"],
                via=_via(),
                iap_command=ssh["iap_command"],
                ports={ip: int(port) for ip, port in ssh.get("ports", {}).items()},
            ),
            api_endpoint=ep["tpu_api"].rstrip("/"),
            token_file=_local_token_file(ep),
            storage_endpoint=os.environ.get("STORAGE_EMULATOR_HOST") or ep.get("storage"),
            compute_endpoint=(ep.get("compute_api") or "").rstrip("/") or None,
        )
    except (ValueError, KeyError, TypeError) as err:
        raise ProviderError(f"{path}: unreadable endpoints ({err!r}); restart the pod") from None


def _local_token_file(ep: dict) -> str | None:
    """The operator's token, unless this process runs on one of the pod's VMs (its metadata
    server set): there the VM's own service account acts, as on GCP."""
    if os.environ.get("GCE_METADATA_HOST"):
        return None
    return ep["identities"]["operator"]["token_file"]


def read_spec(path: Path) -> dict:
    try:
        spec = json.loads(Path(path).read_text())
    except OSError as err:
        raise ProviderError(f"--spec {path}: {err.strerror}") from None
    except ValueError as err:
        raise ProviderError(f"--spec {path}: not JSON ({err})") from None
    return check_spec(spec, str(path))


def check_spec(spec, where: str) -> dict:
    if isinstance(spec, dict) and spec.get("api") == COMPUTE:
        missing = [k for k in COMPUTE_KEYS if not spec.get(k)]
        if missing or not (spec.get("manager") or {}).get("name"):
            raise ProviderError(
                f"{where}: a Compute Engine slice spec needs {', '.join(COMPUTE_KEYS)} and the "
                f"group's name (missing: {', '.join(missing) or 'manager.name'}); export it "
                "again: `pulumi stack output node_spec --json`"
            )
        return spec
    if not isinstance(spec, dict) or not all(k in spec for k in ("parent", "node_id", "node")):
        raise ProviderError(
            f"{where}: a node spec needs `parent`, `node_id` and `node` "
            "(the stack's `node_spec` output: `pulumi stack output node_spec --json`)"
        )
    parts = str(spec["parent"]).split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != "locations":
        raise ProviderError(f"{where}: parent {spec['parent']!r} is not projects/P/locations/Z")
    return spec


def gcp_target(stack: str, spec_file: Path | None, cache: Path) -> Target:
    if spec_file is not None:
        spec = read_spec(spec_file)
    else:
        spec = check_spec(cached_outputs(stack, cache)["node_spec"], f"stack {stack} node_spec")
    if spec.get("api") == COMPUTE:
        project, zone, node = spec["project"], spec["zone"], spec["manager"]["name"]
    else:
        _, project, _, zone = spec["parent"].split("/")
        node = spec["node_id"]
    user = os.environ.get("TPUPOD_SSH_USER") or getpass.getuser()
    key = os.environ.get("TPUPOD_SSH_KEY") or _default_key()
    return Target(
        stack=stack,
        project=project,
        zone=zone,
        node=node,
        spec=spec,
        ssh=SshSettings(user=user, key_file=key, via=_via()),
    )


def cached_outputs(stack: str, cache: Path) -> dict:
    """The stack outputs, from `target.json` beside the journal or `pulumi stack output` once."""
    path = cache / "target.json"
    if path.is_file():
        return json.loads(path.read_text())
    if (ROOT / "stacks").is_dir() and stack not in known_stacks():
        raise ProviderError(
            f"unknown stack {stack!r}: stacks are {', '.join(known_stacks())}; to add one write "
            f"stacks/Pulumi.{stack}.yaml, run `pulumi stack init {stack}` and deploy it"
        )
    if shutil.which("pulumi") is None:
        raise ProviderError(PULUMI_MISSING)
    proc = subprocess.run(
        ["pulumi", "stack", "output", "--json", "--show-secrets", "--stack", stack],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        last = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise ProviderError(f"pulumi stack output --stack {stack} failed: {last[0].strip()}")
    outputs = json.loads(proc.stdout or "{}")
    spec = outputs.get("node_spec")
    if isinstance(spec, str):
        spec = json.loads(spec)
    if not spec:
        raise ProviderError(f"stack {stack!r} exports no node_spec: deploy it first")
    keep = {k: outputs.get(k) for k in ("tpu_name", "zone", "project")} | {"node_spec": spec}
    write_atomic(path, keep)
    return keep


def _default_key() -> str | None:
    key = Path.home() / ".ssh" / "google_compute_engine"
    return str(key) if key.exists() else None
