"""MigSlice: a multi-host TPU slice made through Compute Engine (`tpupod:api: compute`).

Three resources from one declaration (infra.mig_spec): the regional workload policy that names
the topology, the instance template, and the zonal managed instance group of `hosts` VMs. The
same network, service account, metadata (startup script included), labels and tags as a TPU
API slice: the workers boot the same way and the job's contract is the same. `spec` is
`mig_spec()` of the declaration, exported as the stack's `node_spec` (with `api: compute`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_gcp as gcp

from infra import catalog, group_cleanup
from infra.component import child_options
from infra.mig_spec import (
    BOOT_DISK_GB,
    MigDeclaration,
    declare,
    mig_spec,
    policy_json,
    template_name,
    template_properties,
)
from infra.node_spec import CLOUD_PLATFORM_SCOPE, resource_path
from infra.tpu_slice import CREATE_TIMEOUT, check_metadata_size, removal_hook


@dataclass(frozen=True)
class MigSliceArgs:
    name: str
    project: str
    zone: str
    accelerator: catalog.Accelerator
    provisioning: str
    reservation: str | None
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str]
    service_account_email: pulumi.Input[str]
    network_tag: str
    metadata: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, Any] | None = None


class MigSlice(pulumi.ComponentResource):
    declaration: MigDeclaration
    policy: gcp.compute.ResourcePolicy
    template: gcp.compute.InstanceTemplate
    manager: gcp.compute.InstanceGroupManager
    spec: pulumi.Output[dict[str, Any]]

    def __init__(self, name: str, args: MigSliceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpupod:infra:MigSlice", name, None, opts)
        mig = self.declaration = declare(
            name=args.name, project=args.project, zone=args.zone, accelerator=args.accelerator,
            provisioning=args.provisioning, reservation=args.reservation,
            network_tag=args.network_tag, worker_metadata=args.metadata, labels=args.labels,
        )  # fmt: skip
        check_metadata_size(mig.metadata)
        policy = policy_json(mig)
        self.policy = gcp.compute.ResourcePolicy(
            f"{name}-topology",
            name=policy["name"],
            project=mig.project,
            region=mig.region,
            description=policy["description"],
            workload_policy=gcp.compute.ResourcePolicyWorkloadPolicyArgs(
                type=policy["workloadPolicy"]["type"],
                accelerator_topology=policy["workloadPolicy"]["acceleratorTopology"],
            ),
            opts=child_options(self, opts),
        )
        network = pulumi.Output.from_input(args.network).apply(resource_path)
        subnetwork = pulumi.Output.from_input(args.subnetwork).apply(resource_path)
        props = pulumi.Output.all(network, subnetwork, args.service_account_email).apply(
            lambda r: template_properties(
                mig, network=r[0], subnetwork=r[1], service_account_email=r[2]
            )  # fmt: skip
        )
        self.template = self._template(name, mig, props, network, subnetwork, args, opts)
        manager = {"type": "OPPORTUNISTIC", "minimal_action": "REPLACE"}
        zones = list((args.capacity or {}).get("zones") or [mig.zone])
        # As the TPU API slice's node: the groups recovery made in other zones go first.
        delete_moved = pulumi.ResourceHook(
            f"{mig.name}-delete-moved", before_delete(mig.project, zones, mig.name)
        )
        self.manager = gcp.compute.InstanceGroupManager(
            f"{name}-group",
            name=mig.name,
            project=mig.project,
            zone=mig.zone,
            description=mig.description,
            base_instance_name=mig.name,
            target_size=mig.hosts,
            versions=[
                gcp.compute.InstanceGroupManagerVersionArgs(
                    name="slice", instance_template=self.template.self_link_unique
                )
            ],  # fmt: skip
            resource_policies=gcp.compute.InstanceGroupManagerResourcePoliciesArgs(
                workload_policy=self.policy.self_link
            ),
            target_size_policies=[
                gcp.compute.InstanceGroupManagerTargetSizePolicyArgs(mode="BULK")
            ],
            instance_lifecycle_policy=gcp.compute.InstanceGroupManagerInstanceLifecyclePolicyArgs(
                default_action_on_failure="DO_NOTHING"
            ),
            update_policy=gcp.compute.InstanceGroupManagerUpdatePolicyArgs(**manager),
            wait_for_instances=True,
            wait_for_instances_status="STABLE",
            opts=child_options(
                self,
                opts,
                custom_timeouts=pulumi.CustomTimeouts(create=CREATE_TIMEOUT),
                hooks=pulumi.ResourceHookBinding(before_delete=[delete_moved]),
            ),  # fmt: skip
        )
        self.spec = pulumi.Output.all(network, subnetwork, args.service_account_email).apply(
            lambda r: mig_spec(
                mig,
                network=r[0],
                subnetwork=r[1],
                service_account_email=r[2],
                capacity=args.capacity,
            )  # fmt: skip
        )
        self.register_outputs({"name": self.manager.name, "spec": self.spec})

    def _template(self, name, mig, props, network, subnetwork, args, opts):
        """The template, named by what it holds (a change is a new template, made first)."""
        affinity = None
        if mig.reservation_affinity:
            found = mig.reservation_affinity
            affinity = gcp.compute.InstanceTemplateReservationAffinityArgs(
                type=found["consumeReservationType"],
                specific_reservation=gcp.compute.InstanceTemplateReservationAffinitySpecificReservationArgs(
                    key=found["key"], values=found["values"]
                ),
            )
        return gcp.compute.InstanceTemplate(
            f"{name}-template",
            name=props.apply(lambda p: template_name(mig, p)),
            project=mig.project,
            description=mig.description,
            machine_type=mig.machine_type,
            disks=[
                gcp.compute.InstanceTemplateDiskArgs(
                    boot=True,
                    auto_delete=True,
                    source_image=mig.image,
                    disk_size_gb=BOOT_DISK_GB,
                )
            ],  # fmt: skip
            network_interfaces=[
                gcp.compute.InstanceTemplateNetworkInterfaceArgs(
                    network=network, subnetwork=subnetwork
                )
            ],  # fmt: skip
            service_account=gcp.compute.InstanceTemplateServiceAccountArgs(
                email=args.service_account_email,
                scopes=[CLOUD_PLATFORM_SCOPE],
            ),
            scheduling=gcp.compute.InstanceTemplateSchedulingArgs(
                provisioning_model=mig.scheduling["provisioningModel"],
                preemptible=mig.scheduling.get("preemptible", False),
                automatic_restart=mig.scheduling["automaticRestart"],
                on_host_maintenance=mig.scheduling["onHostMaintenance"],
                instance_termination_action=mig.scheduling.get("instanceTerminationAction"),
            ),
            reservation_affinity=affinity,
            shielded_instance_config=gcp.compute.InstanceTemplateShieldedInstanceConfigArgs(
                enable_secure_boot=True
            )
            if mig.secure_boot
            else None,  # fmt: skip
            metadata=mig.metadata,
            tags=list(mig.tags),
            labels=mig.labels,
            opts=child_options(self, opts),
        )


def before_delete(
    project: str,
    zones: list[str],
    name: str,
    client: Callable[[], Any] = group_cleanup.google_client,
    say: Callable[[str], None] = pulumi.log.info,
) -> Callable[[pulumi.ResourceHookArgs], Awaitable[None]]:
    """The group's before_delete hook: `group_cleanup.remove_groups` of the slice's name in
    `zones` but the one it was declared in (Pulumi deletes that one itself), with `client()`
    (ADC on Google's endpoint)."""
    return removal_hook(
        lambda declared: group_cleanup.remove_groups(
            client(), project, zones, name, skip_zone=declared
        ),
        say,
    )
