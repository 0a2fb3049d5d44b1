"""TpuSlice: the TPU VM slice itself (`gcp.tpu.V2Vm`), one node with N workers.

V2Vm, not V2QueuedResource: only V2Vm carries metadata, a service account and spot. Everything
but labels, metadata, tags, description and data disks replaces the node, so the name is fixed
and the old node goes first (`delete_before_replace`): one slice's quota, never two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from infra.metadata import METADATA_LIMIT_BYTES
from infra.security import EXTERNAL_IPS_LABEL

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Large slices can take a long time to be granted and booted.
CREATE_TIMEOUT = "90m"

SCHEDULING_BY_PROVISIONING: dict[str, dict[str, bool] | None] = {
    "spot": {"spot": True},
    "preemptible": {"preemptible": True},
    "reserved": {"reserved": True},
    "on-demand": None,
}


@dataclass(frozen=True)
class TpuSliceArgs:
    name: str
    zone: str
    accelerator_type: str  # the API string, e.g. v5litepod-16
    runtime_version: str
    provisioning: str
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str]
    service_account_email: pulumi.Input[str]
    network_tag: str
    metadata: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    enable_external_ips: bool = False


class TpuSlice(pulumi.ComponentResource):
    node: gcp.tpu.V2Vm
    worker_internal_ips: pulumi.Output[list[str]]
    worker_external_ips: pulumi.Output[list[str]]

    def __init__(self, name: str, args: TpuSliceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpupod:infra:TpuSlice", name, None, opts)
        check_metadata_size(args.metadata)
        labels = dict(args.labels)
        if args.enable_external_ips:
            labels[EXTERNAL_IPS_LABEL[0]] = EXTERNAL_IPS_LABEL[1]
        scheduling = SCHEDULING_BY_PROVISIONING[args.provisioning]
        self.node = gcp.tpu.V2Vm(
            f"{name}-node",
            name=args.name,
            zone=args.zone,
            accelerator_type=args.accelerator_type,
            runtime_version=args.runtime_version,
            description=f"tpupod slice {args.name} ({args.accelerator_type}, {args.provisioning})",
            scheduling_config=gcp.tpu.V2VmSchedulingConfigArgs(**scheduling)
            if scheduling
            else None,
            network_config=gcp.tpu.V2VmNetworkConfigArgs(
                network=args.network,
                subnetwork=args.subnetwork,
                enable_external_ips=args.enable_external_ips,
            ),
            service_account=gcp.tpu.V2VmServiceAccountArgs(
                email=args.service_account_email, scopes=[CLOUD_PLATFORM_SCOPE]
            ),
            labels=labels,
            tags=[args.network_tag],
            metadata=args.metadata,
            opts=pulumi.ResourceOptions(
                parent=self,
                delete_before_replace=True,
                custom_timeouts=pulumi.CustomTimeouts(create=CREATE_TIMEOUT),
            ),
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
                "worker_internal_ips": self.worker_internal_ips,
                "worker_external_ips": self.worker_external_ips,
            }
        )


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
