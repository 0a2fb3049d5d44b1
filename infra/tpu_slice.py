"""TpuSlice: the TPU VM slice itself (`gcp.tpu.V2Vm`), one node with N workers, and its node spec.

V2Vm, not V2QueuedResource: only V2Vm carries metadata, a service account and spot. Everything
but labels, metadata, tags, description and data disks replaces the node, so the name is fixed
and the old node goes first (`delete_before_replace`): one slice's quota, never two. The fields
come from `infra.node_spec.declare`, and `spec` is `node_spec()` of that same declaration: what
ops sends to `nodes.create` when it recreates a preempted node without running Pulumi.

Recovery's nodes and queued requests live outside Pulumi's state, in any zone of tpupod:zones,
so the node carries a `before_delete` hook: before Pulumi deletes (or replaces) it, every node
and request labelled with the stack goes, in every zone (infra.cleanup). The engine runs delete
hooks only with the program (`pulumi destroy --run-program`); it refuses a plain destroy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_gcp as gcp

from contract.metadata import METADATA_LIMIT_BYTES
from infra import cleanup
from infra.component import child_options
from infra.node_spec import NodeDeclaration, declare, node_spec, resource_path

# Large slices can take a long time to be granted and booted.
CREATE_TIMEOUT = "90m"


@dataclass(frozen=True)
class TpuSliceArgs:
    name: str
    project: str
    zone: str
    accelerator_type: str  # the API string, e.g. v5litepod-16
    runtime_version: str
    provisioning: str
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str]
    service_account_email: pulumi.Input[str]
    network_tag: str
    metadata: dict[str, str]
    stack: str  # whose nodes and requests the delete hook removes (its `tpupod-stack` label)
    labels: dict[str, str] = field(default_factory=dict)
    enable_external_ips: bool = False
    capacity: dict[str, Any] | None = None  # how recovery asks for the slice (node spec)


class TpuSlice(pulumi.ComponentResource):
    node: gcp.tpu.V2Vm
    declaration: NodeDeclaration
    spec: pulumi.Output[dict[str, Any]]
    worker_internal_ips: pulumi.Output[list[str]]
    worker_external_ips: pulumi.Output[list[str]]

    def __init__(self, name: str, args: TpuSliceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpupod:infra:TpuSlice", name, None, opts)
        node = self.declaration = declare(
            name=args.name,
            project=args.project,
            zone=args.zone,
            accelerator_type=args.accelerator_type,
            runtime_version=args.runtime_version,
            provisioning=args.provisioning,
            network_tag=args.network_tag,
            worker_metadata=args.metadata,
            labels=args.labels,
            enable_external_ips=args.enable_external_ips,
        )
        check_metadata_size(node.metadata)
        network = pulumi.Output.from_input(args.network).apply(resource_path)
        subnetwork = pulumi.Output.from_input(args.subnetwork).apply(resource_path)
        zones = list((args.capacity or {}).get("zones") or [node.zone])
        # Created in every run (the engine calls a hook by the name kept in the state, and fails
        # the delete if this run registered none), once per program: the name is the node's.
        delete_owned = pulumi.ResourceHook(
            f"{node.name}-delete-owned", before_delete(node.project, zones, args.stack)
        )
        self.node = gcp.tpu.V2Vm(
            f"{name}-node",
            name=node.name,
            project=node.project,
            zone=node.zone,
            accelerator_type=node.accelerator_type,
            runtime_version=node.runtime_version,
            description=node.description,
            scheduling_config=gcp.tpu.V2VmSchedulingConfigArgs(**node.scheduling)
            if node.scheduling
            else None,
            network_config=gcp.tpu.V2VmNetworkConfigArgs(
                network=network,
                subnetwork=subnetwork,
                enable_external_ips=node.enable_external_ips,
            ),
            service_account=gcp.tpu.V2VmServiceAccountArgs(
                email=args.service_account_email, scopes=list(node.scopes)
            ),
            shielded_instance_config=gcp.tpu.V2VmShieldedInstanceConfigArgs(enable_secure_boot=True)
            if node.secure_boot
            else None,
            labels=node.labels,
            tags=list(node.tags),
            metadata=node.metadata,
            opts=child_options(
                self,
                opts,
                delete_before_replace=True,
                custom_timeouts=pulumi.CustomTimeouts(create=CREATE_TIMEOUT),
                hooks=pulumi.ResourceHookBinding(before_delete=[delete_owned]),
            ),
        )
        self.spec = pulumi.Output.all(network, subnetwork, args.service_account_email).apply(
            lambda resolved: node_spec(
                node,
                network=resolved[0],
                subnetwork=resolved[1],
                service_account_email=resolved[2],
                capacity=args.capacity,
            )
        )
        endpoints = self.node.network_endpoints
        self.worker_internal_ips = endpoints.apply(
            lambda eps: [e.ip_address for e in eps or [] if e.ip_address]
        )
        self.worker_external_ips = endpoints.apply(
            lambda eps: [
                a.external_ip for e in eps or [] for a in e.access_configs or [] if a.external_ip
            ]
        )
        self.register_outputs(
            {
                "name": self.node.name,
                "spec": self.spec,
                "worker_internal_ips": self.worker_internal_ips,
                "worker_external_ips": self.worker_external_ips,
            }
        )


def before_delete(
    project: str,
    zones: list[str],
    stack: str,
    client: Callable[[], Any] = cleanup.google_client,
    say: Callable[[str], None] = pulumi.log.info,
) -> Callable[[pulumi.ResourceHookArgs], Awaitable[None]]:
    """The node's before_delete hook: `cleanup.remove_owned` in `zones` and the zone the node
    was declared in, with `client()` (ADC on Google's endpoint)."""
    return removal_hook(
        lambda declared: cleanup.remove_owned(
            client(), project, [*zones, declared] if declared else list(zones), stack
        ),
        say,
    )


def removal_hook(
    remove: Callable[[str | None], Any], say: Callable[[str], None]
) -> Callable[[pulumi.ResourceHookArgs], Awaitable[None]]:
    """A before_delete hook that runs `remove(the zone the resource was declared in, from the
    hook's old inputs)` off the event loop and says each line of what it removed. `remove`
    raises CleanupError: the engine fails the delete with its line."""

    async def hook(args: pulumi.ResourceHookArgs) -> None:
        declared = (args.old_inputs or {}).get("zone")
        removal = await asyncio.to_thread(remove, declared if isinstance(declared, str) else None)
        for line in removal.lines():
            say(f"{args.name}: {line}")

    return hook


def metadata_bytes(metadata: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())


def check_metadata_size(metadata: dict[str, str]) -> None:
    """GCE refuses metadata over 512 KiB in total; fail at preview instead, with the culprit."""
    size = metadata_bytes(metadata)
    if size > METADATA_LIMIT_BYTES:
        largest = max(metadata, key=lambda k: len(metadata[k].encode()))
        raise pulumi.RunError(
            f"worker metadata is {size} bytes, over the {METADATA_LIMIT_BYTES}-byte GCE limit; "
            f"the largest key is {largest!r}: shrink it (e.g. bootstrap/startup.sh)"
        )
