"""Watcher: the VM that runs `tpupod watch` for the stack, so recovery needs no laptop.

A small on-demand VM (e2-small by default) in the workers' subnet: no external IP (Private Google
Access reaches the TPU API and GCS, the stack's NAT reaches PyPI), shielded VM with secure boot,
OS Login on and project keys blocked. Its own service account holds what recovery needs and no
more: a custom role with TPU node get/list/create/delete and operations get (getGuestAttributes is
checked as `tpu.nodes.get`), or for a slice through Compute Engine what the catalog says its
group's and VMs' calls need (`recovery_permissions`); `iam.serviceAccountUser` on the WORKER account only (a node is
created to run as it); the bucket's `ops/<stack>/` prefix read-write and `bundles/` read-only, by
IAM condition; log writing; `compute.osAdminLogin` to log in to the workers through OS Login as its
own POSIX user (docs/seams.md, "Watcher to workers"). A firewall rule lets its tag reach the
workers' tag on tcp:22 and nothing else.

Its startup script (bootstrap/watcher-startup.sh) installs uv and the stack's code bundle by
hash and runs `tpupod watch` under systemd (bootstrap/tpupod-watcher.service). The node spec it
recreates from comes in its metadata (`tpupod-node-spec`), the same `node_spec` the stack exports.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_gcp as gcp

from contract import iam
from contract.metadata import METADATA_LIMIT_BYTES
from infra.component import child_options
from infra.grants import bucket_prefix_role, project_roles, ssh_ingress
from infra.identity import READ_ONLY, READ_WRITE
from infra.security import OS_LOGIN_METADATA

WATCHER_SCRIPT_PATH = Path(__file__).resolve().parent.parent / "bootstrap" / "watcher-startup.sh"
WATCHER_UNIT_PATH = Path(__file__).resolve().parent.parent / "bootstrap" / "tpupod-watcher.service"
NODE_SPEC_KEY = "tpupod-node-spec"
UNIT_KEY = "tpupod-watcher-unit"
IMAGE = "debian-cloud/debian-12"
# What `ops.cloud.tpu.TpuProvider` calls, as IAM checks it (contract/iam_catalog.json): nodes get and
# getGuestAttributes (tpu.nodes.get), list, create, delete; queued resources get, list, create,
# delete, which IAM authorises as tpu.nodes.get / list / create / delete (there are no
# tpu.queuedResources.* permissions: a custom role naming one is refused at `pulumi up`);
# operations get.
TPU_PERMISSIONS = (
    "tpu.nodes.get",
    "tpu.nodes.list",
    "tpu.nodes.create",
    "tpu.nodes.delete",
    "tpu.operations.get",
)
# What `ops.cloud.compute.ComputeProvider` calls (a slice through Compute Engine): the group's
# get, listManagedInstances, insert and delete, its VMs' get and guest attributes, zone
# operations; the role holds exactly the permissions the catalog says these methods need.
COMPUTE_METHODS = (
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.listManagedInstances",
    "compute.instanceGroupManagers.insert",
    "compute.instanceGroupManagers.delete",
    "compute.instances.get",
    "compute.instances.getGuestAttributes",
    "compute.zoneOperations.get",
)


def recovery_permissions(api: str) -> tuple[str, ...]:
    """The watcher role's permissions for the slice's API (`tpu` or `compute`)."""
    if api != "compute":
        return TPU_PERMISSIONS
    needed = (p for method in COMPUTE_METHODS for p in iam.catalog().needs(method))
    return tuple(sorted(set(needed)))


PROJECT_ROLES = (
    "roles/logging.logWriter",
    # OS Login with sudo on the TPU workers (trainerctl stop/start run as root, Contract 4).
    "roles/compute.osAdminLogin",
)
SERVICE_ACCOUNT_USER = "roles/iam.serviceAccountUser"
ROLE_DESCRIPTIONS = {
    "tpu": "TPU node get/list/create/delete and operations get: recovery only",
    "compute": "the slice's instance group get/insert/delete, its VMs' get and guest "
    "attributes, zone operations get: recovery only",
}
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)


@dataclass(frozen=True)
class WatcherVmArgs:
    name: str  # GCE name of the VM; the account id, tag and role id derive from it
    account_id: str  # 6-30 characters
    project: str
    zone: str
    stack: str
    machine_type: str
    subnetwork: pulumi.Input[str]
    network: pulumi.Input[str]
    bucket: pulumi.Input[str]
    worker_service_account: pulumi.Input[str]  # email
    worker_tag: str
    node_spec: pulumi.Input[dict[str, Any]]
    labels: dict[str, str] = field(default_factory=dict)
    api: str = "tpu"  # the slice's: which API its recovery calls (recovery_permissions)


def watcher_tag(name: str) -> str:
    return name if name.endswith("-watcher") else f"{name}-watcher"


def check_permissions(role: str, permissions: tuple[str, ...]) -> list[str]:
    """A custom role's permissions, each one IAM knows (the catalog's); RunError naming the
    first it does not, as IAM's 400 at `pulumi up` would."""
    unknown = iam.catalog().unknown(permissions)
    if unknown:
        raise pulumi.RunError(
            f"custom role {role} names permission {unknown[0]!r}, which IAM does not know "
            f"(contract/iam_catalog.json, from Google's IAM reference); IAM refuses such a role"
        )
    return list(permissions)


def role_id(stack: str) -> str:
    """Custom role ids: letters, digits, `_` and `.`; per stack (a project may hold several)."""
    return "tpupodWatcher_" + re.sub(r"[^a-zA-Z0-9_]", "_", stack)[:48]


def watcher_metadata(stack: str, bucket: str, spec: dict[str, Any]) -> dict[str, str]:
    """Every metadata key of the watcher VM; checked against GCE's 512 KiB limit."""
    metadata = {
        "startup-script": WATCHER_SCRIPT_PATH.read_text(),
        UNIT_KEY: WATCHER_UNIT_PATH.read_text(),
        NODE_SPEC_KEY: json.dumps(spec, sort_keys=True, separators=(",", ":")),
        "tpupod-stack": stack,
        "tpupod-bucket": bucket,
        **OS_LOGIN_METADATA,
    }
    size = sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())
    if size > METADATA_LIMIT_BYTES:
        raise pulumi.RunError(
            f"watcher metadata is {size} bytes, over the {METADATA_LIMIT_BYTES}-byte GCE limit; "
            f"the node spec alone is {len(metadata[NODE_SPEC_KEY])} bytes"
        )
    return metadata


class WatcherVm(pulumi.ComponentResource):
    """The VM that runs `tpupod watch` for the stack (ops.watch.Watcher is the loop itself). Its
    type token stays `tpupod:infra:Watcher`: a new token would replace the VM on `pulumi up`."""

    email: pulumi.Output[str]
    instance_name: pulumi.Output[str]

    def __init__(self, name: str, args: WatcherVmArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpupod:infra:Watcher", name, None, opts)
        child = child_options(self, opts)
        account = gcp.serviceaccount.Account(
            f"{name}-sa",
            account_id=args.account_id,
            project=args.project,
            display_name="tpupod watcher",
            description=f"Recovers the TPU slice of stack {args.stack} (tpupod watch)",
            opts=child,
        )
        member = account.email.apply(lambda email: f"serviceAccount:{email}")
        role = gcp.projects.IAMCustomRole(
            f"{name}-tpu-role",
            project=args.project,
            role_id=role_id(args.stack),
            title=f"tpupod watcher ({args.stack})",
            description=ROLE_DESCRIPTIONS[args.api],
            permissions=check_permissions(role_id(args.stack), recovery_permissions(args.api)),
            opts=child,
        )
        gcp.projects.IAMMember(
            f"{name}-tpu",
            project=args.project,
            role=f"projects/{args.project}/roles/{role_id(args.stack)}",  # known at preview
            member=member,
            opts=child_options(self, opts, depends_on=[role]),
        )
        project_roles(name, args.project, member, PROJECT_ROLES, child)
        worker_account = pulumi.Output.from_input(args.worker_service_account).apply(
            lambda email: f"projects/{args.project}/serviceAccounts/{email}"
        )
        gcp.serviceaccount.IAMMember(
            f"{name}-act-as-workers",
            service_account_id=worker_account,
            role=SERVICE_ACCOUNT_USER,
            member=member,
            opts=child,
        )
        for grant, role_name, prefix, why in (
            ("ops", READ_WRITE, f"ops/{args.stack}/", "the watcher's journal, incident and lease"),
            ("bundles", READ_ONLY, "bundles/", "code bundles, read only"),
        ):
            bucket_prefix_role(f"{name}-bucket-{grant}", args.bucket, role_name, member, prefix,
                               f"tpupod watcher {grant}", f"{prefix}: {why}", child)  # fmt: skip
        tag = watcher_tag(args.name)
        ssh_ingress(f"{name}-ssh-to-workers", f"{args.name}-ssh", args.network,
                    "SSH from the watcher VM to the workers, nothing else", args.worker_tag, child,
                    source_tags=[tag])  # fmt: skip
        metadata = pulumi.Output.all(args.bucket, args.node_spec).apply(
            lambda resolved: watcher_metadata(args.stack, resolved[0], resolved[1])
        )
        instance = gcp.compute.Instance(
            f"{name}-vm",
            name=args.name,
            project=args.project,
            zone=args.zone,
            machine_type=args.machine_type,
            description=f"tpupod watcher of stack {args.stack}",
            boot_disk=gcp.compute.InstanceBootDiskArgs(
                initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                    image=IMAGE, size=10, type="pd-balanced"
                )
            ),
            network_interfaces=[
                gcp.compute.InstanceNetworkInterfaceArgs(subnetwork=args.subnetwork)
            ],  # no access_configs: no external IP
            service_account=gcp.compute.InstanceServiceAccountArgs(
                email=account.email, scopes=list(SCOPES)
            ),
            shielded_instance_config=gcp.compute.InstanceShieldedInstanceConfigArgs(
                enable_secure_boot=True, enable_vtpm=True, enable_integrity_monitoring=True
            ),
            scheduling=gcp.compute.InstanceSchedulingArgs(
                provisioning_model="STANDARD", automatic_restart=True, preemptible=False
            ),
            tags=[tag],
            labels={**args.labels, "tpupod-role": "watcher"},
            metadata=metadata,
            allow_stopping_for_update=True,
            opts=child,
        )
        self.email = account.email
        self.instance_name = instance.name
        self.register_outputs({"email": self.email, "instance": self.instance_name})
