"""The watcher VM under Pulumi mocks: every stack declares it (none with `tpupod:watcher: false`),
the security rules hold for it and fire when it is spoiled, bad watcher config is one RunError
line with nothing declared, and its metadata carries the node spec the stack exports."""

from __future__ import annotations

import copy
import json

import pulumi
import pytest

from contract import iam
from infra import offline, policies
from infra.security import OS_LOGIN_METADATA
from infra.watcher_vm import NODE_SPEC_KEY, TPU_PERMISSIONS, recovery_permissions

STACKS = offline.stack_names()  # both paths: a TPU API node's and a Compute Engine group's
INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
PROJECT_IAM = "gcp:projects/iAMMember:IAMMember"
BUCKET_IAM = "gcp:storage/bucketIAMMember:BucketIAMMember"
SA_IAM = "gcp:serviceaccount/iAMMember:IAMMember"


def watcher_resources(evaluation: offline.Evaluation) -> list:
    return [r for r in evaluation.resources if r.name.startswith("watcher")]


def fired(resource) -> list[str]:
    return policies.violations(resource.type, resource.inputs, resource.protect)


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_declares_the_watcher_and_its_rules_hold(evaluations, stack):
    evaluation = evaluations[stack]
    vm = evaluation.one(INSTANCE).inputs
    assert vm["machineType"] == "e2-small"
    assert vm["scheduling"]["provisioningModel"] == "STANDARD"  # on demand: never preempted
    assert all(not nic.get("accessConfigs") for nic in vm["networkInterfaces"])
    assert vm["networkInterfaces"][0]["subnetwork"].endswith("-subnet-id")  # the stack's subnet
    assert vm["shieldedInstanceConfig"]["enableSecureBoot"] is True
    assert {k: vm["metadata"][k] for k in OS_LOGIN_METADATA} == OS_LOGIN_METADATA
    email = vm["serviceAccount"]["email"]
    assert "-watch@" in email and "compute@developer" not in email
    assert json.loads(vm["metadata"][NODE_SPEC_KEY]) == evaluation.values["node_spec"]
    for resource in evaluation.resources:
        assert not fired(resource), (resource.name, fired(resource))
    assert not policies.stack_violations((r.type, r.inputs) for r in evaluation.resources)


@pytest.mark.parametrize("stack", STACKS)
def test_the_watcher_account_holds_what_recovery_needs_and_no_more(evaluations, stack):
    evaluation = evaluations[stack]
    ours = watcher_resources(evaluation)
    project_roles = sorted(r.inputs["role"] for r in ours if r.type == PROJECT_IAM)
    assert project_roles == sorted(
        [
            "roles/compute.osAdminLogin",
            "roles/logging.logWriter",
            f"projects/tpupod-test-project/roles/tpupodWatcher_{stack.replace('-', '_')}",
        ]
    )
    assert not [role for role in project_roles if role.startswith("roles/storage.")]
    role = next(r for r in ours if r.type == "gcp:projects/iAMCustomRole:IAMCustomRole")
    api = evaluation.values["slice_api"]
    assert role.inputs["permissions"] == list(recovery_permissions(api))
    if api == "tpu":
        assert role.inputs["permissions"] == list(TPU_PERMISSIONS)
    else:  # what ComputeProvider's calls need, and nothing of the TPU API
        assert "compute.instanceGroupManagers.delete" in role.inputs["permissions"]
        assert not [p for p in role.inputs["permissions"] if p.startswith("tpu.")]
    (act_as,) = [r for r in ours if r.type == SA_IAM]
    assert act_as.inputs["role"] == "roles/iam.serviceAccountUser"
    worker_email = evaluation.values["service_account_email"]
    assert act_as.inputs["serviceAccountId"].endswith(f"/serviceAccounts/{worker_email}")
    grants = {r.inputs["role"]: r.inputs["condition"]["expression"] for r in ours
              if r.type == BUCKET_IAM}  # fmt: skip
    assert set(grants) == {"roles/storage.objectUser", "roles/storage.objectViewer"}
    assert f"/objects/ops/{stack}" in grants["roles/storage.objectUser"]
    assert "/objects/bundles" in grants["roles/storage.objectViewer"]


@pytest.mark.parametrize("stack", STACKS)
def test_ssh_from_the_watcher_tag_only_to_port_22(evaluations, stack):
    evaluation = evaluations[stack]
    vm = evaluation.one(INSTANCE).inputs
    rules = [r for r in evaluation.of_type(FIREWALL) if r.inputs.get("sourceTags") == vm["tags"]]
    assert len(rules) == 1
    rule = rules[0].inputs
    assert rule["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    slices = evaluation.of_type("gcp:tpu/v2Vm:V2Vm") or evaluation.of_type(
        "gcp:compute/instanceTemplate:InstanceTemplate")  # fmt: skip
    assert rule["targetTags"] == [slices[0].inputs["tags"][0]]
    assert not rule.get("sourceRanges")


SPOILERS = {
    "external IP": (
        INSTANCE,
        lambda p: p["networkInterfaces"][0].update(accessConfigs=[{}]),
        "tpupod-vm-no-external-ip",
    ),
    "default SA": (
        INSTANCE,
        lambda p: p["serviceAccount"].update(email="123-compute@developer.gserviceaccount.com"),
        "tpupod-not-default-compute-sa",
    ),
    "no secure boot": (
        INSTANCE,
        lambda p: p.update(shieldedInstanceConfig={}),
        "tpupod-vm-secure-boot",
    ),
    "OS Login off": (
        INSTANCE,
        lambda p: p["metadata"].update({"enable-oslogin": "FALSE"}),
        "tpupod-os-login",
    ),
    "more than SSH from the tag": (
        FIREWALL,
        lambda p: p.update(allows=[{"protocol": "tcp"}]) if p.get("sourceTags") else None,
        "tpupod-watcher-ssh-only",
    ),
}


@pytest.mark.parametrize("spoiler", SPOILERS)
def test_spoiling_the_watcher_fires_a_rule(evaluations, spoiler):
    resource_type, spoil, rule = SPOILERS[spoiler]
    resources = [r for r in watcher_resources(evaluations["v4-8"]) if r.type == resource_type]
    assert resources
    props = copy.deepcopy(resources[0].inputs)
    spoil(props)
    assert any(v.startswith(rule + ":") for v in policies.violations(resource_type, props)), props


def test_project_storage_role_fires_for_the_watcher_account(evaluations):
    grant = next(r for r in watcher_resources(evaluations["v4-8"]) if r.type == PROJECT_IAM)
    props = {**grant.inputs, "role": "roles/storage.objectAdmin"}
    assert any(
        "tpupod-no-project-storage-role" in v for v in policies.violations(PROJECT_IAM, props)
    )


def test_opting_out_declares_no_watcher():
    config = {**offline.stack_config("v4-8"), "tpupod:watcher": "false"}
    evaluation = offline.evaluate("v4-8", config)
    assert not watcher_resources(evaluation)
    assert not evaluation.of_type(INSTANCE)
    assert "watcher_instance" not in evaluation.values
    assert evaluation.of_type("gcp:tpu/v2Vm:V2Vm")  # the rest of the stack is all there


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"tpupod:watcher": "maybe"},
            "tpupod:watcher: 'maybe' is not true or false; `true` (the default) declares the "
            "watcher VM that recovers the slice, `false` opts out (then keep `tpupod watch` "
            "running)",
        ),
        (
            {"tpupod:watcherMachineType": "e2-gigantic"},
            "tpupod:watcherMachineType: unknown machine type 'e2-gigantic'; use one of e2-micro, "
            "e2-small, e2-medium, e2-standard-2, n2-standard-2, n2d-standard-2, t2d-standard-1",
        ),
    ],
)
def test_bad_watcher_config_is_one_line_and_declares_nothing(changes, message):
    config = {**offline.stack_config("v4-8"), **changes}
    evaluation = offline.evaluate("v4-8", config, check=False)
    assert isinstance(evaluation.error, pulumi.RunError), evaluation.error
    assert str(evaluation.error) == message
    assert evaluation.resources == []


def test_watcher_metadata_is_far_below_the_limit(evaluations):
    for stack in STACKS:
        metadata = evaluations[stack].one(INSTANCE).inputs["metadata"]
        assert sum(len(k) + len(v.encode()) for k, v in metadata.items()) < 128 * 1024


def test_a_custom_role_naming_a_permission_iam_does_not_know_is_refused(monkeypatch):
    """As IAM refuses it at `pulumi up` (HTTP 400): at evaluation, one line naming role and
    permission, nothing of the watcher's role declared. The old role's first queued-resource
    permission is the case; today's permissions are the negative control."""
    from infra import watcher_vm as watcher

    monkeypatch.setattr(watcher, "TPU_PERMISSIONS", (*TPU_PERMISSIONS, "tpu.queuedResources.get"))
    spoiled = offline.evaluate("v4-8", check=False)
    assert isinstance(spoiled.error, pulumi.RunError)
    message = str(spoiled.error)
    assert "\n" not in message
    assert "tpupodWatcher_v4_8" in message and "'tpu.queuedResources.get'" in message
    assert not spoiled.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
    monkeypatch.undo()
    assert offline.evaluate("v4-8").of_type("gcp:projects/iAMCustomRole:IAMCustomRole")


@pytest.mark.parametrize("stack", STACKS)
def test_every_role_a_stack_grants_is_one_iam_knows(evaluations, stack):
    """Predefined roles from Google's catalog, custom roles from the stack, no permission IAM
    would refuse."""
    evaluation = evaluations[stack]
    custom = {f"projects/{r.inputs['project']}/roles/{r.inputs['roleId']}": r.inputs["permissions"]
              for r in evaluation.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")}  # fmt: skip
    for perms in custom.values():
        assert iam.catalog().unknown(perms) == []
    for r in evaluation.resources:
        if "role" in r.inputs and r.type != "gcp:projects/iAMCustomRole:IAMCustomRole":
            assert iam.catalog().role(r.inputs["role"], custom), (r.name, r.inputs["role"])
