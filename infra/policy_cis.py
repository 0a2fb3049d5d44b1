"""CIS-style rules for a slice, storage access and firewall exposure (pure predicates).

Registered in `infra.policies.RULES` / `STACK_RULES` next to the original rules; same shapes:
per-resource checks take (resource type, wire props, protect), stack checks take every resource.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contract import iam
from infra import catalog, exposure
from infra.security import OS_LOGIN_METADATA, SOFT_DELETE_DAYS_RANGE

SUBNETWORK = "gcp:compute/subnetwork:Subnetwork"
FIREWALL = "gcp:compute/firewall:Firewall"
PROJECT_IAM = {"gcp:projects/iAMMember:IAMMember", "gcp:projects/iAMBinding:IAMBinding"}
BUCKET_IAM = {
    "gcp:storage/bucketIAMMember:BucketIAMMember",
    "gcp:storage/bucketIAMBinding:BucketIAMBinding",
}
STORAGE_ROLE_PREFIX = "roles/storage."
OBJECT_PERMISSIONS = "storage.objects."
PREFIX_CONDITION = "resource.name.startsWith("
MIN_SOFT_DELETE_SECONDS = SOFT_DELETE_DAYS_RANGE[0] * 24 * 60 * 60


def os_login(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    metadata = props.get("metadata") or {}
    return [
        f"metadata {key!r} is {metadata.get(key)!r}, not {value!r} (CIS: OS Login, no project keys)"
        for key, value in OS_LOGIN_METADATA.items()
        if str(metadata.get(key, "")).upper() != value
    ]


def secure_boot(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    try:
        generation = catalog.lookup(str(props.get("acceleratorType") or "")).generation
    except catalog.CatalogError:
        return []  # a type the catalog does not know: nothing to hold it to
    shielded = props.get("shieldedInstanceConfig") or {}
    if generation.secure_boot and shielded.get("enableSecureBoot") is not True:
        return [f"{generation.name} node without shieldedInstanceConfig.enableSecureBoot"]
    return []


def flow_logs(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    log_config = props.get("logConfig") or {}
    if not log_config or log_config.get("flowSampling") == 0:
        return ["subnet without VPC flow logs (logConfig)"]
    return []


def private_google_access(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    if props.get("privateIpGoogleAccess") is not True:
        return ["subnet without Private Google Access (privateIpGoogleAccess)"]
    return []


def soft_delete(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    seconds = int((props.get("softDeletePolicy") or {}).get("retentionDurationSeconds") or 0)
    if seconds < MIN_SOFT_DELETE_SECONDS:
        return [
            f"bucket soft delete keeps objects {seconds} s; at least "
            f"{MIN_SOFT_DELETE_SECONDS} s ({SOFT_DELETE_DAYS_RANGE[0]} days)"
        ]
    return []


def no_project_storage_role(
    resource_type: str, props: Mapping[str, Any], protect: bool
) -> list[str]:
    role = str(props.get("role") or "")
    if role.startswith(STORAGE_ROLE_PREFIX):
        return [f"project-wide {role}; grant it on the bucket, by prefix"]
    return []


def reaches_objects(role: str) -> bool:
    """The role reads or writes objects (IAM catalog: a storage.objects.* permission); a role the
    catalog does not know counts as one (a custom role's permissions are not at hand here)."""
    try:
        permissions = iam.catalog().role(role)
    except iam.CatalogError:
        return True
    return any(p.startswith(OBJECT_PERMISSIONS) for p in permissions)


def bucket_grants_by_prefix(
    resource_type: str, props: Mapping[str, Any], protect: bool
) -> list[str]:
    role = str(props.get("role") or "")
    expression = str((props.get("condition") or {}).get("expression") or "")
    if (role.startswith(STORAGE_ROLE_PREFIX) and reaches_objects(role)
            and PREFIX_CONDITION not in expression):  # fmt: skip
        return [f"{role} on the whole bucket; limit it to a prefix ({PREFIX_CONDITION}...)"]
    return []


def _vpc_cidrs(resources: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    cidrs: list[str] = []
    for resource_type, props in resources:
        if resource_type == SUBNETWORK:
            cidrs += [str(props["ipCidrRange"])] if props.get("ipCidrRange") else []
            cidrs += [
                str(r["ipCidrRange"])
                for r in props.get("secondaryIpRanges") or []
                if r.get("ipCidrRange")
            ]
    return cidrs


def narrow_ingress(resources: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Per port, the union of all ingress sources: beyond IAP and the VPC, a /16 at most."""
    firewalls = [props for resource_type, props in resources if resource_type == FIREWALL]
    return exposure.wide_ports(firewalls, _vpc_cidrs(resources))
