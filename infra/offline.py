"""Run the Pulumi program offline, in-process, under `pulumi.runtime.set_mocks`.

Used by tests/infra and bench/infra_eval.py: each call is a fresh mock engine (settings, root
stack, config), runs `__main__.py` through runpy and waits for every pending output, so the same
process can evaluate every stack in turn. Nothing reaches GCP.
"""

from __future__ import annotations

import asyncio
import json
import runpy
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import mocks, rpc, settings
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra import catalog

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PROGRAM = PROJECT_ROOT / "__main__.py"
STACKS_DIR = PROJECT_ROOT / "stacks"
TEST_PROJECT = "tpupod-test-project"


@dataclass(frozen=True)
class Registered:
    """One resource as the engine would see it: wire (camelCase) inputs plus options."""

    type: str
    name: str
    urn: str
    parent: str
    inputs: dict[str, Any]
    custom: bool
    protect: bool
    delete_before_replace: bool
    create_timeout: str
    dependencies: tuple[str, ...] = ()  # URNs it waits for (depends_on, expanded)
    hooks: dict[str, tuple[str, ...]] = field(default_factory=dict)  # before_delete -> names


@dataclass
class Evaluation:
    stack: str
    resources: list[Registered] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)  # resource hooks registered, by name
    outputs: dict[str, pulumi.Output] = field(default_factory=dict)  # as exported (Outputs)
    values: dict[str, Any] = field(default_factory=dict)  # the same, resolved
    error: Exception | None = None

    def of_type(self, type_: str) -> list[Registered]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str) -> Registered:
        found = self.of_type(type_)
        assert len(found) == 1, f"expected one {type_}, got {len(found)}"
        return found[0]


class CloudMocks(pulumi.runtime.Mocks):
    """Echo inputs back and fill in what GCP would compute, under the wire (camelCase) names."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        state = dict(args.inputs)
        state.update(_computed(args.typ, args.name, args.inputs))
        return f"{state.get('name', args.name)}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list | None]:
        return {}, None


def _computed(type_: str, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    if type_ == "gcp:tpu/v2Vm:V2Vm":
        hosts = catalog.lookup(inputs["acceleratorType"]).hosts
        external = (inputs.get("networkConfig") or {}).get("enableExternalIps", False)
        return {
            "networkEndpoints": [
                {
                    "ipAddress": f"10.64.0.{10 + i}",
                    "port": 8470,
                    "accessConfigs": [{"externalIp": f"203.0.113.{10 + i}"}] if external else [],
                }
                for i in range(hosts)
            ],
            "state": "READY",
        }
    if type_ == "gcp:serviceaccount/account:Account":
        project = inputs.get("project") or TEST_PROJECT
        return {"email": f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"}
    if type_ == "gcp:storage/bucket:Bucket":
        return {"url": f"gs://{inputs['name']}", "selfLink": f"storage/{inputs['name']}"}
    if type_.startswith("gcp:compute/"):
        return {"selfLink": f"compute/{inputs.get('name', name)}"}
    return {}


class RecordingMonitor(mocks.MockMonitor):
    """MockMonitor that also keeps each registration's inputs and options (protect, timeouts,
    resource hooks) and the resource hooks registered, refusing a name registered twice as the
    engine does (the SDK's mock accepts it)."""

    def __init__(self, cloud: pulumi.runtime.Mocks):
        super().__init__(cloud)
        self.registered: list[Registered] = []
        self.hooks: list[str] = []
        self._lock = threading.Lock()

    def RegisterResourceHook(self, request):  # noqa: N802 (gRPC method name)
        with self._lock:
            if request.name in self.hooks:
                raise ValueError(f"resource hook already registered for name {request.name!r}")
            self.hooks.append(request.name)
        return super().RegisterResourceHook(request)

    def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            record = Registered(
                type=request.type,
                name=request.name,
                urn=response.urn,
                parent=request.parent,
                inputs=rpc.deserialize_properties(request.object),
                custom=request.custom,
                protect=request.protect,
                delete_before_replace=request.deleteBeforeReplace,
                create_timeout=request.customTimeouts.create,
                dependencies=tuple(request.dependencies),
                hooks=_hook_names(request.hooks),
            )
            with self._lock:
                self.registered.append(record)
        return response


def _hook_names(binding) -> dict[str, tuple[str, ...]]:
    """The hooks a registration binds, by kind (before_delete, ...), where it binds any."""
    kinds = [f.name for f in binding.DESCRIPTOR.fields]
    return {kind: tuple(getattr(binding, kind)) for kind in kinds if getattr(binding, kind)}


def import_provider_sdk() -> None:
    """Import the pulumi_gcp modules the program uses (the package loads them lazily, slowly)."""
    import pulumi_gcp as gcp

    for module in (gcp.compute, gcp.storage, gcp.tpu, gcp.serviceaccount, gcp.projects):
        getattr(module, "__all__", None) or dir(module)


def stack_names(api: str | None = None) -> list[str]:
    """Every `stacks/Pulumi.<stack>.yaml`, discovered; with `api`, those whose slice that API
    makes (tpupod:api, or the catalog's default)."""
    names = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in STACKS_DIR.glob("Pulumi.*.yaml"))
    return names if api is None else [n for n in names if stack_api(n) == api]


def stack_api(stack: str) -> str:
    from infra.config import parse, raw_from_config_map

    return parse(raw_from_config_map(stack_config(stack)), stack=stack).resolved_api


def stack_config(stack: str, project: str | None = TEST_PROJECT) -> dict[str, str]:
    """The stack file's config as the CLI hands it to a program: strings, lists as JSON."""
    raw = yaml.safe_load((STACKS_DIR / f"Pulumi.{stack}.yaml").read_text()) or {}
    values = dict(raw.get("config") or {})
    if project is not None:
        values.setdefault("gcp:project", project)
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


def _ensure_event_loop() -> None:
    """Pulumi's mocks run on the thread's current event loop (`asyncio.get_event_loop`), and an
    `asyncio.run` earlier in the same process leaves the thread with none: set a new one."""
    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())


def evaluate(stack: str, config: dict[str, str] | None = None, *, check: bool = True) -> Evaluation:
    """Run `__main__.py` for `stack` (config from its stack file unless given) under mocks.

    With `check=False` a program error is kept in `Evaluation.error` instead of raised, so a test
    can look at what was (not) registered before it.
    """
    settings.ROOT.set(None)
    _ensure_event_loop()
    cloud = CloudMocks()
    monitor = RecordingMonitor(cloud)
    pulumi.runtime.set_mocks(cloud, project="tpupod", stack=stack, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(stack_config(stack) if config is None else config)
    settings.SETTINGS.outputs.clear()
    evaluation = Evaluation(stack=stack)
    try:
        _sync_await(run_pulumi_func(lambda: runpy.run_path(str(PROGRAM), run_name="__main__")))
        root = settings.get_root_resource()
        evaluation.outputs = dict(root.outputs) if root is not None else {}
        evaluation.values = {
            key: _sync_await(pulumi.Output.from_input(value).future())
            for key, value in evaluation.outputs.items()
        }
    except Exception as error:  # noqa: BLE001 (kept for the caller, re-raised when check)
        evaluation.error = error
    evaluation.resources = sorted(monitor.registered, key=lambda r: r.urn)
    evaluation.hooks = list(monitor.hooks)
    if check and evaluation.error is not None:
        raise evaluation.error
    return evaluation
