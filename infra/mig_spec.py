"""A slice made through Compute Engine, as declared (pure: no Pulumi import).

Google's shape for a multi-host TPU slice on Compute Engine: a regional resource policy whose
workload policy names the accelerator topology (`HIGH_THROUGHPUT`, e.g. `2x2x2`), an instance
template (the TPU machine type, the accelerator image, the stack's metadata and service
account, spot scheduling) and a zonal managed instance group of `hosts` VMs that uses both.
`declare()` is the one place that decides those fields; MigSlice builds its Pulumi resources
from it and exports `mig_spec()` of the same declaration: the bodies Compute Engine v1's REST
API takes (`resourcePolicies.insert`, `instanceTemplates.insert`, `instanceGroupManagers.insert`),
so recovery can recreate the slice without Pulumi, as it does a TPU API node from `node_spec`.

Why these settings:
- `targetSizePolicy.mode: BULK`: the MIG makes every VM of the slice or none (a slice of 3 of
  its 4 hosts cannot train).
- `instanceLifecyclePolicy.defaultActionOnFailure: DO_NOTHING` and an OPPORTUNISTIC update
  policy: Google cannot reschedule one instance of a slice, so neither a repair nor a rolling
  update may replace VMs one at a time; the watcher recreates the slice as a unit.
- Spot: `provisioningModel: SPOT` with `preemptible: true` and no automatic restart (what the
  provider asks of SPOT), `onHostMaintenance: TERMINATE` (TPU VMs do not live-migrate) and
  `instanceTerminationAction: STOP`: a preempted VM stays in the group as TERMINATED, which the
  watcher reads as the slice's preemption, instead of vanishing (DELETE) and being recreated
  alone by the MIG to meet its target size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra import catalog
from infra.api_choice import COMPUTE_PROVISIONING
from infra.node_spec import CLOUD_PLATFORM_SCOPE
from infra.security import OS_LOGIN_METADATA

WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"
# A Compute Engine VM publishes its SSH host keys as guest attributes (`hostkeys/`) only when
# its metadata turns them on; recovery pins each worker's key from there (a TPU API node's
# workers publish theirs without it).
GUEST_ATTRIBUTES_METADATA = {"enable-guest-attributes": "TRUE"}
BOOT_DISK_GB = 100
TERMINATION_ACTION = "STOP"


@dataclass(frozen=True)
class MigDeclaration:
    """Every field of the slice's three Compute Engine resources that the stack decides."""

    name: str  # the MIG's, also its VMs' base name and the policy's and template's prefix
    project: str
    zone: str
    machine_type: str
    image: str
    topology: str
    hosts: int
    provisioning: str  # tpupod's mode (spot, on-demand, reserved)
    reservation: str | None
    description: str
    labels: dict[str, str]
    tags: tuple[str, ...]
    metadata: dict[str, str]
    secure_boot: bool

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    @property
    def policy_name(self) -> str:
        return f"{self.name}-topology"

    @property
    def scheduling(self) -> dict[str, Any]:
        """The template's `scheduling`, as Compute Engine v1 spells it."""
        model = COMPUTE_PROVISIONING[self.provisioning]
        body: dict[str, Any] = {"provisioningModel": model, "onHostMaintenance": "TERMINATE",
                                "automaticRestart": False}  # fmt: skip
        if model == "SPOT":
            body.update(preemptible=True, instanceTerminationAction=TERMINATION_ACTION)
        return body

    @property
    def reservation_affinity(self) -> dict[str, Any] | None:
        if self.reservation is None:
            return None
        return {"consumeReservationType": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name", "values": [self.reservation]}  # fmt: skip


def declare(*, name: str, project: str, zone: str, accelerator: catalog.Accelerator,
            provisioning: str, reservation: str | None, network_tag: str,
            worker_metadata: Mapping[str, str], labels: Mapping[str, str]) -> MigDeclaration:  # fmt: skip
    offer = accelerator.generation.compute
    if offer is None or accelerator.topology is None:
        raise ValueError(f"{accelerator.name} is not made through Compute Engine")
    return MigDeclaration(
        name=name,
        project=project,
        zone=zone,
        machine_type=offer.machine_type,
        image=offer.image,
        topology=accelerator.topology,
        hosts=accelerator.hosts,
        provisioning=provisioning,
        reservation=reservation,
        description=f"tpupod slice {name} ({accelerator.name}, {accelerator.topology}, "
        f"{provisioning}, Compute Engine)",
        labels=dict(labels),
        tags=(network_tag,),
        metadata={**worker_metadata, **OS_LOGIN_METADATA, **GUEST_ATTRIBUTES_METADATA},
        secure_boot=accelerator.generation.secure_boot,
    )


def policy_json(mig: MigDeclaration) -> dict[str, Any]:
    return {"name": mig.policy_name, "region": mig.region,
            "description": f"the accelerator topology of {mig.name}",
            "workloadPolicy": {"type": WORKLOAD_POLICY_TYPE,
                               "acceleratorTopology": mig.topology}}  # fmt: skip


def template_properties(mig: MigDeclaration, *, network: str, subnetwork: str,
                        service_account_email: str) -> dict[str, Any]:  # fmt: skip
    """The template's `properties`: no access config, so no external IP."""
    props: dict[str, Any] = {
        "machineType": mig.machine_type,
        "description": mig.description,
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "type": "PERSISTENT",
                "initializeParams": {"sourceImage": mig.image, "diskSizeGb": str(BOOT_DISK_GB)},
            }
        ],  # fmt: skip
        "networkInterfaces": [{"network": network, "subnetwork": subnetwork}],
        "serviceAccounts": [{"email": service_account_email, "scopes": [CLOUD_PLATFORM_SCOPE]}],
        "scheduling": mig.scheduling,
        "metadata": {"items": [{"key": k, "value": v} for k, v in sorted(mig.metadata.items())]},
        "tags": {"items": list(mig.tags)},
        "labels": dict(mig.labels),
    }
    if mig.reservation_affinity:
        props["reservationAffinity"] = mig.reservation_affinity
    if mig.secure_boot:
        props["shieldedInstanceConfig"] = {"enableSecureBoot": True}
    return props


def template_name(mig: MigDeclaration, properties: dict[str, Any]) -> str:
    """Templates are immutable: a change is a new template (its name from what it holds), which
    the group then uses for the VMs it makes next, while the old one is deleted."""
    digest = hashlib.sha256(json.dumps(properties, sort_keys=True).encode()).hexdigest()[:10]
    return f"{mig.name}-{digest}"


def manager_json(mig: MigDeclaration, *, template: str, policy: str) -> dict[str, Any]:
    return {
        "name": mig.name,
        "baseInstanceName": mig.name,
        "description": mig.description,
        "instanceTemplate": template,
        "targetSize": mig.hosts,
        "resourcePolicies": {"workloadPolicy": policy},
        "targetSizePolicy": {"mode": "BULK"},
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
        "updatePolicy": {"type": "OPPORTUNISTIC", "minimalAction": "REPLACE"},
    }


def mig_spec(mig: MigDeclaration, *, network: str, subnetwork: str, service_account_email: str,
             capacity: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """What recreates the slice without Pulumi (the stack's `node_spec` output on this path):
    `api: compute` tells it from a TPU API node spec."""
    policy = f"projects/{mig.project}/regions/{mig.region}/resourcePolicies/{mig.policy_name}"
    props = template_properties(mig, network=network, subnetwork=subnetwork,
                                service_account_email=service_account_email)  # fmt: skip
    name = template_name(mig, props)
    template = f"projects/{mig.project}/global/instanceTemplates/{name}"
    return {
        "api": catalog.COMPUTE,
        "project": mig.project,
        "zone": mig.zone,
        "region": mig.region,
        "capacity": dict(capacity or {"via": "direct", "zones": [mig.zone]}),
        "workload_policy": policy_json(mig),
        "template": {"name": name, "properties": props},
        "manager": manager_json(mig, template=template, policy=policy),
    }
