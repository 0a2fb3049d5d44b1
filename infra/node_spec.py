"""The TPU node as declared, and the node spec `nodes.create` takes (pure: no Pulumi import).

`declare()` is the one place that decides the node's fields; TpuSlice builds its `gcp.tpu.V2Vm`
from it and exports `node_spec()` of the same declaration, so what ops sends to
`TpuClient.create_node` to recreate a preempted slice is what Pulumi declared (Contract 2:
`{"parent", "node_id", "node"}`, the node as the REST API spells it).

Network and subnetwork: the TPU API takes a name or a resource path such as
`projects/P/global/networks/N` and `projects/P/regions/R/subnetworks/S`
(https://cloud.google.com/tpu/docs/configure-networking-access). The stack passes the resource
path (the `id` Pulumi gives a VPC and subnet); a `https://.../compute/v1/` self link given as
`existingNetwork` is cut to that path, for the V2Vm and the spec alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra import catalog
from infra.security import EXTERNAL_IPS_LABEL, OS_LOGIN_METADATA

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
SCHEDULING_BY_PROVISIONING: dict[str, dict[str, bool]] = {
    "spot": {"spot": True},
    "preemptible": {"preemptible": True},
    "reserved": {"reserved": True},
    "on-demand": {},
}
_SELF_LINK_PREFIX = re.compile(r"^https://[^/]+/compute/(v1|beta|alpha)/")


@dataclass(frozen=True)
class NodeDeclaration:
    """Every field of the node that the stack decides; network and account come resolved later."""

    name: str
    project: str
    zone: str
    accelerator_type: str  # the API string, e.g. v5litepod-16
    runtime_version: str
    description: str
    scheduling: dict[str, bool]
    enable_external_ips: bool
    scopes: tuple[str, ...]
    labels: dict[str, str]
    tags: tuple[str, ...]
    metadata: dict[str, str]
    secure_boot: bool

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"


def declare(
    *,
    name: str,
    project: str,
    zone: str,
    accelerator_type: str,
    runtime_version: str,
    provisioning: str,
    network_tag: str,
    worker_metadata: Mapping[str, str],
    labels: Mapping[str, str],
    enable_external_ips: bool = False,
) -> NodeDeclaration:
    """The node's fields: worker metadata plus the CIS keys, opt-in labels, catalog secure boot."""
    all_labels = dict(labels)
    if enable_external_ips:
        all_labels[EXTERNAL_IPS_LABEL[0]] = EXTERNAL_IPS_LABEL[1]
    return NodeDeclaration(
        name=name,
        project=project,
        zone=zone,
        accelerator_type=accelerator_type,
        runtime_version=runtime_version,
        description=f"tpupod slice {name} ({accelerator_type}, {provisioning})",
        scheduling=dict(SCHEDULING_BY_PROVISIONING[provisioning]),
        enable_external_ips=enable_external_ips,
        scopes=(CLOUD_PLATFORM_SCOPE,),
        labels=all_labels,
        tags=(network_tag,),
        metadata={**worker_metadata, **OS_LOGIN_METADATA},
        secure_boot=catalog.lookup(accelerator_type).generation.secure_boot,
    )


def resource_path(name_or_link: str) -> str:
    """A network or subnetwork as the TPU API takes it: a self link becomes `projects/...`."""
    return _SELF_LINK_PREFIX.sub("", name_or_link)


def node_json(
    node: NodeDeclaration, *, network: str, subnetwork: str, service_account_email: str
) -> dict[str, Any]:
    """The Node message in the REST API's JSON spelling (`Node.from_json` accepts it)."""
    body: dict[str, Any] = {
        "acceleratorType": node.accelerator_type,
        "runtimeVersion": node.runtime_version,
        "description": node.description,
        "networkConfig": {
            "network": resource_path(network),
            "subnetwork": resource_path(subnetwork),
            "enableExternalIps": node.enable_external_ips,
        },
        "serviceAccount": {"email": service_account_email, "scope": list(node.scopes)},
        "schedulingConfig": dict(node.scheduling),
        "metadata": dict(node.metadata),
        "labels": dict(node.labels),
        "tags": list(node.tags),
    }
    if node.secure_boot:
        body["shieldedInstanceConfig"] = {"enableSecureBoot": True}
    return body


def node_spec(
    node: NodeDeclaration,
    *,
    network: str,
    subnetwork: str,
    service_account_email: str,
    capacity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Contract 2: `TpuClient.create_node(parent=..., node_id=..., node=Node.from_json(...))`,
    and `capacity`: how recovery asks for it (queued or direct, the zones in order)."""
    return {
        "capacity": dict(capacity or {"via": "direct", "zones": [node.zone]}),
        "parent": node.parent,
        "node_id": node.name,
        "node": node_json(
            node,
            network=network,
            subnetwork=subnetwork,
            service_account_email=service_account_email,
        ),
    }
