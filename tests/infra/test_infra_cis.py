"""Every stack carries the CIS items that apply to a slice; removing any one makes its rule fire.

The rules are the shared predicates in infra/policies.py (the policy pack wraps them unchanged),
applied to each stack's real registrations under mocks, then to copies with one item taken out.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from infra import catalog, offline, policies, policy_cis
from infra.security import OS_LOGIN_METADATA

STACKS = offline.stack_names()
TPU = "gcp:tpu/v2Vm:V2Vm"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"  # a Compute Engine slice's VMs
SUBNET = "gcp:compute/subnetwork:Subnetwork"
BUCKET = "gcp:storage/bucket:Bucket"
BUCKET_IAM = "gcp:storage/bucketIAMMember:BucketIAMMember"


def _drop(key: str) -> Callable[[dict], None]:
    return lambda props: props.pop(key)


def _drop_metadata(key: str) -> Callable[[dict], None]:
    return lambda props: props["metadata"].pop(key)


# item -> (resource type, how to take it out, the rule that must fire)
REMOVALS = {
    "OS Login": (TPU, _drop_metadata("enable-oslogin"), "tpupod-os-login"),
    "blocked project keys": (TPU, _drop_metadata("block-project-ssh-keys"), "tpupod-os-login"),
    "OS Login (Compute Engine)": (TEMPLATE, _drop_metadata("enable-oslogin"), "tpupod-os-login"),
    "no external IP (Compute Engine)": (
        TEMPLATE,
        lambda p: p["networkInterfaces"][0].update(accessConfigs=[{"networkTier": "PREMIUM"}]),
        "tpupod-vm-no-external-ip",
    ),
    "flow logs": (SUBNET, _drop("logConfig"), "tpupod-subnet-flow-logs"),
    "Private Google Access": (
        SUBNET,
        lambda p: p.update(privateIpGoogleAccess=False),
        "tpupod-subnet-private-google-access",
    ),
    "soft delete": (BUCKET, _drop("softDeletePolicy"), "tpupod-bucket-soft-delete"),
    "soft delete too short": (
        BUCKET,
        lambda p: p.update(softDeletePolicy={"retentionDurationSeconds": 86400}),
        "tpupod-bucket-soft-delete",
    ),
    "prefix condition": (BUCKET_IAM, _drop("condition"), "tpupod-bucket-grants-by-prefix"),
}


def rules_fired(resource_type: str, props: dict, protect: bool) -> set[str]:
    return {v.split(":", 1)[0] for v in policies.violations(resource_type, props, protect)}


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_carries_the_items(evaluations, stack):
    evaluation = evaluations[stack]
    node = (evaluation.of_type(TPU) or evaluation.of_type(TEMPLATE))[0].inputs
    assert {k: node["metadata"][k] for k in OS_LOGIN_METADATA} == OS_LOGIN_METADATA
    accelerator = node["labels"]["tpupod-accelerator"]
    generation = catalog.lookup(accelerator).generation
    assert ("shieldedInstanceConfig" in node) is generation.secure_boot
    if generation.secure_boot:
        assert node["shieldedInstanceConfig"] == {"enableSecureBoot": True}
    subnet = evaluation.one(SUBNET).inputs
    assert subnet["logConfig"] and subnet["privateIpGoogleAccess"] is True
    bucket = evaluation.one(BUCKET).inputs
    assert bucket["softDeletePolicy"]["retentionDurationSeconds"] == 7 * 86400
    assert not [
        r
        for r in evaluation.resources
        if r.type.startswith("gcp:projects/")
        and r.inputs.get("role", "").startswith("roles/storage.")
    ]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("item", REMOVALS)
def test_removing_an_item_fires_its_rule(evaluations, stack, item):
    resource_type, remove, rule = REMOVALS[item]
    for resource in evaluations[stack].of_type(resource_type):
        if resource_type == BUCKET_IAM and not policy_cis.reaches_objects(resource.inputs["role"]):
            continue  # the bucket's metadata alone (roles/storage.bucketViewer): nothing to limit
        assert rule not in rules_fired(resource.type, resource.inputs, resource.protect)
        props = copy.deepcopy(resource.inputs)
        remove(props)
        assert rule in rules_fired(resource.type, props, resource.protect), (item, resource.name)


@pytest.mark.parametrize("stack", STACKS)
def test_removing_secure_boot_fires(evaluations, stack):
    node = (evaluations[stack].of_type(TPU) or evaluations[stack].of_type(TEMPLATE))[0]
    rule = "tpupod-secure-boot" if node.type == TPU else "tpupod-vm-secure-boot"
    assert rule not in rules_fired(node.type, node.inputs, node.protect)
    props = copy.deepcopy(node.inputs)
    del props["shieldedInstanceConfig"]
    assert rule in rules_fired(node.type, props, node.protect)


def test_only_roles_that_reach_objects_need_a_prefix():
    """The catalog tells a bucket-metadata role (no condition needed) from an object role."""
    whole = {"role": "roles/storage.bucketViewer", "bucket": "b", "member": "serviceAccount:x"}
    assert "tpupod-bucket-grants-by-prefix" not in rules_fired(BUCKET_IAM, whole, False)
    for role in ("roles/storage.objectViewer", "roles/storage.admin"):
        props = {**whole, "role": role}
        assert "tpupod-bucket-grants-by-prefix" in rules_fired(BUCKET_IAM, props, False)


def test_a_type_the_catalog_does_not_know_is_not_held_to_secure_boot():
    props = {"acceleratorType": "v2-8", "metadata": dict(OS_LOGIN_METADATA)}
    assert "tpupod-secure-boot" not in rules_fired(TPU, props, False)


@pytest.mark.parametrize("stack", STACKS)
def test_a_project_wide_storage_role_fires(evaluations, stack):
    grant = next(
        r for r in evaluations[stack].resources if r.type == "gcp:projects/iAMMember:IAMMember"
    )
    props = {**grant.inputs, "role": "roles/storage.objectAdmin"}
    assert "tpupod-no-project-storage-role" in rules_fired(grant.type, props, False)


@pytest.mark.parametrize("stack", STACKS)
def test_an_open_listed_ssh_rule_fires_the_stack_rule(evaluations, stack):
    resources = [(r.type, copy.deepcopy(r.inputs)) for r in evaluations[stack].resources]
    assert policies.stack_violations(resources) == []
    iap = next(
        p for t, p in resources if t == "gcp:compute/firewall:Firewall" and "sourceRanges" in p
    )
    resources.append(("gcp:compute/firewall:Firewall", {**iap, "sourceRanges": ["0.0.0.0/1"]}))
    resources.append(("gcp:compute/firewall:Firewall", {**iap, "sourceRanges": ["128.0.0.0/1"]}))
    found = policies.stack_violations(resources)
    assert len(found) == 1 and found[0].startswith("tpupod-narrow-ingress: ")
