"""Each security rule flags what it should and passes what it should; the pack wraps them all."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

from contract import metadata
from infra import policies
from infra.security import (
    EXTERNAL_IPS_LABEL,
    IAP_RANGE,
    LISTED_SSH_MARKER,
    OS_LOGIN_METADATA,
    UNPROTECTED_LABEL,
)

POLICY_PACK = Path(__file__).resolve().parents[2] / "policy" / "__main__.py"
GOOD_SA = {"email": "tpupod-v4-8@p.iam.gserviceaccount.com", "scopes": []}


SOFT_DELETE = {"softDeletePolicy": {"retentionDurationSeconds": 7 * 86400}}


def tpu(**overrides):
    props = {
        "networkConfig": {"enableExternalIps": False},
        "serviceAccount": GOOD_SA,
        "labels": {},
        "metadata": dict(OS_LOGIN_METADATA),
    }
    return props | overrides


def bucket(**props):
    return SOFT_DELETE | props


def ssh_rule(ranges, description=""):
    return {
        "direction": "INGRESS",
        "sourceRanges": ranges,
        "description": description,
        "allows": [{"protocol": "tcp", "ports": ["22"]}],
    }


BAD = [
    (policies.TPU_VM, tpu(networkConfig={"enableExternalIps": True}), False, "external IPs"),
    (policies.FIREWALL, ssh_rule(["0.0.0.0/0"]), False, "whole internet"),
    (
        policies.FIREWALL,
        {"direction": "INGRESS", "allows": [{"protocol": "tcp"}]},
        False,
        "0.0.0.0/0",
    ),
    (policies.FIREWALL, ssh_rule(["198.51.100.0/24"]), False, "neither IAP nor listed"),
    (
        policies.FIREWALL,
        {"sourceRanges": ["10.0.0.0/8"], "allows": [{"protocol": "tcp", "ports": ["1-1024"]}]},
        False,
        "neither IAP nor listed",
    ),
    (
        "gcp:projects/iAMMember:IAMMember",
        {"role": "roles/editor", "member": "user:a@b.c"},
        False,
        "primitive role",
    ),
    (
        policies.TPU_VM,
        tpu(serviceAccount={"email": "1234-compute@developer.gserviceaccount.com"}),
        False,
        "default compute",
    ),
    (policies.TPU_VM, tpu(serviceAccount=None), False, "default compute"),
    (
        "gcp:storage/bucketIAMMember:BucketIAMMember",
        {
            "role": "roles/storage.objectViewer",
            "member": "serviceAccount:1-compute@developer.gserviceaccount.com",
        },
        False,
        "default compute",
    ),
    (
        policies.BUCKET,
        {"uniformBucketLevelAccess": False, "publicAccessPrevention": "enforced"},
        True,
        "uniform",
    ),
    (
        policies.BUCKET,
        {"uniformBucketLevelAccess": True, "publicAccessPrevention": "inherited"},
        True,
        "public access",
    ),
    (
        policies.BUCKET,
        {"uniformBucketLevelAccess": True, "publicAccessPrevention": "enforced"},
        False,
        "not protected",
    ),
    (
        policies.BUCKET,
        {
            "uniformBucketLevelAccess": True,
            "publicAccessPrevention": "enforced",
            "forceDestroy": True,
        },
        True,
        "force_destroy",
    ),
    (policies.TPU_VM, tpu(metadata={"hf-token": "abc"}), False, "looks like a secret"),
    (
        policies.TPU_VM,
        tpu(metadata={"startup-script": "export HF=hf_" + "a" * 34}),
        False,
        "Hugging Face",
    ),
    (
        policies.TPU_VM,
        tpu(metadata={"startup-script": "-----BEGIN RSA PRIVATE KEY-----\n"}),
        False,
        "PEM",
    ),
    (
        policies.TPU_VM,
        tpu(metadata={"startup-script": "DB_PASSWORD='correcthorsebattery'"}),
        False,
        "literal",
    ),
]

GOOD = [
    (policies.TPU_VM, tpu(), False),
    (
        policies.TPU_VM,
        tpu(networkConfig={"enableExternalIps": True}, labels=dict([EXTERNAL_IPS_LABEL])),
        False,
    ),
    (policies.FIREWALL, ssh_rule([IAP_RANGE]), False),
    (policies.FIREWALL, ssh_rule(["203.0.113.0/24"], f"{LISTED_SSH_MARKER}=203.0.113.0/24"), False),
    (
        policies.FIREWALL,
        {"sourceTags": ["w"], "targetTags": ["w"], "allows": [{"protocol": "tcp"}]},
        False,
    ),
    (policies.FIREWALL, {"direction": "EGRESS", "destinationRanges": ["0.0.0.0/0"]}, False),
    (
        "gcp:projects/iAMMember:IAMMember",
        {"role": "roles/logging.logWriter", "member": "serviceAccount:x"},
        False,
    ),
    (
        policies.BUCKET,
        bucket(uniformBucketLevelAccess=True, publicAccessPrevention="enforced"),
        True,
    ),
    (
        policies.BUCKET,
        bucket(
            uniformBucketLevelAccess=True,
            publicAccessPrevention="enforced",
            labels=dict([UNPROTECTED_LABEL]),
        ),
        False,
    ),
    (
        policies.TPU_VM,
        tpu(
            metadata={
                **OS_LOGIN_METADATA,
                "startup-script": "token=$(md instance/service-accounts/default/token)",
            }
        ),
        False,
    ),
]


@pytest.mark.parametrize(("type_", "props", "protect", "fragment"), BAD)
def test_rule_flags(type_, props, protect, fragment):
    found = policies.violations(type_, props, protect)
    assert any(fragment in v for v in found), found


@pytest.mark.parametrize(("type_", "props", "protect"), GOOD)
def test_rule_passes(type_, props, protect):
    assert policies.violations(type_, props, protect) == []


def test_the_real_startup_script_is_not_a_secret():
    props = tpu(metadata={**OS_LOGIN_METADATA, metadata.STARTUP_SCRIPT: metadata.startup_script()})
    assert policies.violations(policies.TPU_VM, props) == []


def test_policy_pack_wraps_every_rule_unchanged():
    pack = runpy.run_path(str(POLICY_PACK), run_name="tpupod_policy_pack")
    wrapped = pack["policies"]()
    assert [p.name for p in wrapped] == [rule.name for rule in policies.RULES] + [
        rule.name for rule in policies.STACK_RULES
    ]
    reported: list[str] = []
    args = SimpleNamespace(
        resource_type=policies.TPU_VM,
        props=tpu(networkConfig={"enableExternalIps": True}),
        opts=SimpleNamespace(protect=False),
    )
    for policy in wrapped[: len(policies.RULES)]:
        policy.validate(args, lambda message, urn=None: reported.append(message))
    assert reported == [
        "TPU workers get external IPs without the stack opting in (enableExternalIps)"
    ]


def test_policy_pack_stack_rule_sees_the_union_of_rules():
    pack = runpy.run_path(str(POLICY_PACK), run_name="tpupod_policy_pack")
    stack_policy = pack["policies"]()[-1]
    halves = [
        SimpleNamespace(resource_type=policies.FIREWALL, props=ssh_rule([half]))
        for half in ("0.0.0.0/1", "128.0.0.0/1")
    ]
    reported: list[str] = []
    stack_policy.validate(
        SimpleNamespace(resources=halves), lambda message, urn=None: reported.append(message)
    )
    assert len(reported) == 1 and reported[0].startswith("0.0.0.0/1, 128.0.0.0/1 open port 22 to")
