"""Security rules as plain predicates over (resource type, wire properties, protect).

The same functions back tests/infra (over mock registrations) and the pulumi-policy pack in
`policy/` (over `pulumi preview`), so a rule cannot drift between the two. Properties use the
engine's camelCase names. Stack rules (`STACK_RULES`) see every resource at once, for what only
the whole stack shows (the union of firewall sources per port). Opt-ins are visible on the
resources themselves (a label or a firewall description written by the component that honours
the stack's opt-in), so the pack needs no config of its own. Each rule returns the violations it
finds; an empty list means it holds.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra import policy_cis, policy_secrets, policy_watcher
from infra.security import EXTERNAL_IPS_LABEL, IAP_RANGE, LISTED_SSH_MARKER, UNPROTECTED_LABEL

TPU_VM = "gcp:tpu/v2Vm:V2Vm"
FIREWALL = "gcp:compute/firewall:Firewall"
BUCKET = "gcp:storage/bucket:Bucket"
INSTANCE = "gcp:compute/instance:Instance"
# A Compute Engine slice's VMs (infra/mig_slice.py) are held to a VM's rules through their template.
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
VMS = frozenset({INSTANCE, TEMPLATE})
SUBNETWORK = policy_cis.SUBNETWORK
IAM_TYPES = {
    "gcp:projects/iAMMember:IAMMember",
    "gcp:projects/iAMBinding:IAMBinding",
    "gcp:storage/bucketIAMMember:BucketIAMMember",
    "gcp:storage/bucketIAMBinding:BucketIAMBinding",
    "gcp:serviceaccount/iAMMember:IAMMember",
    "gcp:serviceaccount/iAMBinding:IAMBinding",
}
PRIMITIVE_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}
DEFAULT_COMPUTE_SA = re.compile(r"-compute@developer\.gserviceaccount\.com$")
OPEN_RANGES = {"0.0.0.0/0", "::/0"}
SSH_PORT = 22

Check = Callable[[str, Mapping[str, Any], bool], list[str]]
StackCheck = Callable[[Sequence[tuple[str, Mapping[str, Any]]]], list[str]]


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    resource_types: frozenset[str]
    check: Check  # (resource_type, props, protect) -> violations


@dataclass(frozen=True)
class StackRule:
    name: str
    description: str
    check: StackCheck  # [(resource_type, props), ...] -> violations


def _labels(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return props.get("labels") or {}


def _opted_in(props: Mapping[str, Any], label: tuple[str, str]) -> bool:
    return _labels(props).get(label[0]) == label[1]


def _network_configs(props: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    single = props.get("networkConfig")
    return ([single] if single else []) + list(props.get("networkConfigs") or [])


def no_external_ips(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    wants_external = any(c.get("enableExternalIps") for c in _network_configs(props))
    if wants_external and not _opted_in(props, EXTERNAL_IPS_LABEL):
        return ["TPU workers get external IPs without the stack opting in (enableExternalIps)"]
    return []


def _is_ingress(props: Mapping[str, Any]) -> bool:
    return (props.get("direction") or "INGRESS").upper() == "INGRESS"


def _source_ranges(props: Mapping[str, Any]) -> list[str]:
    return [str(r) for r in props.get("sourceRanges") or []]


def no_open_ingress(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    if not _is_ingress(props):
        return []
    ranges = _source_ranges(props)
    if not ranges and not props.get("sourceTags") and not props.get("sourceServiceAccounts"):
        return ["ingress rule without any source applies to 0.0.0.0/0"]
    opened = sorted(OPEN_RANGES.intersection(ranges))
    return [f"ingress from {r} (the whole internet)" for r in opened]


def _port_matches(ports: Iterable[str], port: int) -> bool:
    for spec in ports:
        low, _, high = str(spec).partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False


def _allows_ssh(props: Mapping[str, Any]) -> bool:
    for allow in props.get("allows") or []:
        protocol = str(allow.get("protocol", "")).lower()
        ports = allow.get("ports") or []
        if protocol in ("tcp", "all", "6") and (not ports or _port_matches(ports, SSH_PORT)):
            return True
    return False


def _listed_ranges(props: Mapping[str, Any]) -> set[str] | None:
    description = str(props.get("description") or "")
    if not description.startswith(f"{LISTED_SSH_MARKER}="):
        return None
    listed = description.split("=", 1)[1]
    return {r for r in listed.split(",") if r}


def ssh_only_from_iap_or_listed(
    resource_type: str, props: Mapping[str, Any], protect: bool
) -> list[str]:
    if not _is_ingress(props) or not _allows_ssh(props):
        return []
    ranges = set(_source_ranges(props))
    allowed = {IAP_RANGE} | (_listed_ranges(props) or set())
    violations = [
        f"SSH allowed from {r}, which is neither IAP nor listed" for r in sorted(ranges - allowed)
    ]
    for cidr in sorted(ranges & allowed - {IAP_RANGE}):
        if ipaddress.ip_network(cidr, strict=False).prefixlen == 0:
            violations.append(f"listed SSH range {cidr} is the whole internet")
    return violations


def _role_members(props: Mapping[str, Any]) -> list[str]:
    members = list(props.get("members") or [])
    return members + ([props["member"]] if props.get("member") else [])


def no_primitive_roles(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    role = str(props.get("role") or "")
    return (
        [f"primitive role {role}; grant a predefined role instead"]
        if role in PRIMITIVE_ROLES
        else []
    )


def not_default_compute_sa(
    resource_type: str, props: Mapping[str, Any], protect: bool
) -> list[str]:
    if resource_type in (TPU_VM, *VMS):
        accounts = props.get("serviceAccount")
        accounts = [accounts] if isinstance(accounts, Mapping) else list(accounts or [])
        emails = [str(a.get("email") or "") for a in accounts]
        if not emails or not all(emails):
            return ["no service account email: the default compute service account would be used"]
        return [
            f"runs as the default compute service account {e}"
            for e in emails
            if DEFAULT_COMPUTE_SA.search(e)
        ]
    return [
        f"grants a role to the default compute service account ({m})"
        for m in _role_members(props)
        if DEFAULT_COMPUTE_SA.search(str(m))
    ]


def bucket_uniform_and_private(
    resource_type: str, props: Mapping[str, Any], protect: bool
) -> list[str]:
    violations = []
    if props.get("uniformBucketLevelAccess") is not True:
        violations.append("bucket without uniform bucket-level access")
    if props.get("publicAccessPrevention") != "enforced":
        violations.append("bucket without public access prevention `enforced`")
    return violations


def bucket_protected(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    if _opted_in(props, UNPROTECTED_LABEL):
        return []
    violations = [] if protect else ["bucket not protected (protect=True) and no opt-out label"]
    if props.get("forceDestroy"):
        violations.append("bucket has force_destroy set")
    return violations


RULES: tuple[Rule, ...] = (
    Rule(
        "tpupod-no-external-ips",
        "TPU workers have no external IPs unless the stack opts in",
        frozenset({TPU_VM}),
        no_external_ips,
    ),
    Rule(
        "tpupod-no-open-ingress",
        "No firewall ingress from 0.0.0.0/0",
        frozenset({FIREWALL}),
        no_open_ingress,
    ),
    Rule(
        "tpupod-ssh-iap-or-listed",
        "SSH only from the IAP range or ranges the stack lists",
        frozenset({FIREWALL}),
        ssh_only_from_iap_or_listed,
    ),
    Rule(
        "tpupod-no-primitive-roles",
        "No owner/editor/viewer grants",
        frozenset(IAM_TYPES),
        no_primitive_roles,
    ),
    Rule(
        "tpupod-not-default-compute-sa",
        "Never the default compute service account",
        frozenset({TPU_VM} | VMS | IAM_TYPES),
        not_default_compute_sa,
    ),
    Rule(
        "tpupod-bucket-uniform-private",
        "Buckets use uniform access and enforced public access prevention",
        frozenset({BUCKET}),
        bucket_uniform_and_private,
    ),
    Rule(
        "tpupod-bucket-protected",
        "The checkpoint bucket is protected and never force-destroyed",
        frozenset({BUCKET}),
        bucket_protected,
    ),
    Rule(
        "tpupod-no-secrets-in-metadata",
        "No secret-looking keys or values in VM metadata",
        frozenset({TPU_VM} | VMS),
        policy_secrets.no_secrets_in_metadata,
    ),
    Rule(
        "tpupod-os-login",
        "TPU nodes use OS Login and block project-wide SSH keys",
        frozenset({TPU_VM} | VMS),
        policy_cis.os_login,
    ),
    Rule(
        "tpupod-secure-boot",
        "TPU nodes boot with secure boot where the generation takes it (infra/catalog.py)",
        frozenset({TPU_VM}),
        policy_cis.secure_boot,
    ),
    Rule(
        "tpupod-subnet-flow-logs",
        "Subnets keep VPC flow logs",
        frozenset({SUBNETWORK}),
        policy_cis.flow_logs,
    ),
    Rule(
        "tpupod-subnet-private-google-access",
        "Subnets have Private Google Access",
        frozenset({SUBNETWORK}),
        policy_cis.private_google_access,
    ),
    Rule(
        "tpupod-bucket-soft-delete",
        "Buckets keep deleted and overwritten objects for at least 7 days (soft delete)",
        frozenset({BUCKET}),
        policy_cis.soft_delete,
    ),
    Rule(
        "tpupod-no-project-storage-role",
        "No Cloud Storage role on the whole project",
        frozenset(policy_cis.PROJECT_IAM),
        policy_cis.no_project_storage_role,
    ),
    Rule(
        "tpupod-bucket-grants-by-prefix",
        "Bucket roles that reach objects are limited to an object prefix by an IAM condition",
        frozenset(policy_cis.BUCKET_IAM),
        policy_cis.bucket_grants_by_prefix,
    ),
)

RULES += (
    Rule(
        "tpupod-vm-no-external-ip",
        "VMs (the watcher, a Compute Engine slice's template) have no external IP",
        VMS,
        policy_watcher.no_external_ip,
    ),
    Rule(
        "tpupod-vm-secure-boot",
        "VMs (the watcher, a Compute Engine slice's template) are shielded VMs with secure boot",
        VMS,
        policy_watcher.shielded_secure_boot,
    ),
    Rule(
        "tpupod-watcher-ssh-only",
        "The watcher's tag reaches the workers on tcp:22 and nothing else",
        frozenset({FIREWALL}),
        policy_watcher.watcher_ssh_only,
    ),
)

STACK_RULES: tuple[StackRule, ...] = (
    StackRule(
        "tpupod-narrow-ingress",
        "Per port, ingress sources beyond IAP and the VPC add up to a /16 at most",
        policy_cis.narrow_ingress,
    ),
)


def violations(resource_type: str, props: Mapping[str, Any], protect: bool = False) -> list[str]:
    """Every rule that applies to this resource, as `rule-name: message` lines."""
    return [
        f"{rule.name}: {message}"
        for rule in RULES
        if resource_type in rule.resource_types
        for message in rule.check(resource_type, props, protect)
    ]


def stack_violations(resources: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Every stack rule over (resource type, props) pairs, as `rule-name: message` lines."""
    listed = list(resources)
    return [f"{rule.name}: {message}" for rule in STACK_RULES for message in rule.check(listed)]
