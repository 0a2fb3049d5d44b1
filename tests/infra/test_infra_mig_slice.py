"""A slice made through Compute Engine (`tpupod:api: compute`), evaluated offline under mocks.

Each Compute Engine stack declares the workload policy, the instance template and the managed
instance group Google documents for a multi-host TPU slice, with the catalog's machine type,
image and topology; the exported spec (`node_spec`, `api: compute`) is what Pulumi declared,
field by field, and Google's own client (google-cloud-compute's v1 types) parses each body
without an unknown field. The same network, identity and metadata as a TPU API slice.
"""

from __future__ import annotations

import json

import pytest
from google.cloud import compute_v1
from google.protobuf import json_format

from infra import catalog, offline, policies
from infra.config import parse, raw_from_config_map
from infra.config_checks import ConfigError
from infra.node_spec import CLOUD_PLATFORM_SCOPE

COMPUTE_STACKS = offline.stack_names(api="compute")
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
GROUP = "gcp:compute/instanceGroupManager:InstanceGroupManager"


def config_of(stack: str):
    return parse(raw_from_config_map(offline.stack_config(stack)), stack=stack)


def test_the_new_generations_have_stacks():
    """A TPU7x slice (Compute Engine only) and a v6e slice on Compute Engine."""
    assert {"tpu7x-16", "v6e-16"} <= set(COMPUTE_STACKS)
    assert config_of("tpu7x-16").api is None  # the catalog's default: TPU7x has no other path
    assert config_of("v6e-16").api == "compute"  # chosen: the TPU API also makes v6e-16


@pytest.mark.parametrize("stack", COMPUTE_STACKS)
def test_policy_template_and_group(evaluations, stack):
    evaluation, config = evaluations[stack], config_of(stack)
    accelerator, offer = config.accelerator, config.accelerator.generation.compute
    policy = evaluation.one(POLICY).inputs
    assert policy["region"] == config.region
    assert policy["workloadPolicy"] == {"type": "HIGH_THROUGHPUT",
                                        "acceleratorTopology": accelerator.topology}  # fmt: skip
    template = evaluation.one(TEMPLATE).inputs
    assert template["machineType"] == offer.machine_type
    assert template["disks"][0]["sourceImage"] == offer.image
    assert template["scheduling"] == {"provisioningModel": "SPOT", "preemptible": True,
                                      "automaticRestart": False, "onHostMaintenance": "TERMINATE",
                                      "instanceTerminationAction": "STOP"}  # fmt: skip
    assert [nic.get("accessConfigs") for nic in template["networkInterfaces"]] == [None]
    assert template["serviceAccount"]["scopes"] == [CLOUD_PLATFORM_SCOPE]
    assert template["labels"]["tpupod-stack"] == stack
    group = evaluation.one(GROUP)
    inputs = group.inputs
    assert (inputs["zone"], inputs["targetSize"]) == (config.resolved_zone, accelerator.hosts)
    assert inputs["targetSizePolicies"] == [{"mode": "BULK"}]
    assert inputs["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}
    assert inputs["updatePolicy"] == {"type": "OPPORTUNISTIC", "minimalAction": "REPLACE"}
    assert inputs["resourcePolicies"]["workloadPolicy"] == f"compute/{policy['name']}"
    assert inputs["baseInstanceName"] == inputs["name"]
    assert group.create_timeout and group.parent.endswith("tpupod:infra:MigSlice::slice")


def _template_as_rest(inputs: dict) -> dict:
    """The Pulumi template's wire inputs under Compute Engine v1's names."""
    disk = inputs["disks"][0]
    props = {
        "machineType": inputs["machineType"],
        "description": inputs["description"],
        "disks": [
            {
                "boot": disk["boot"],
                "autoDelete": disk["autoDelete"],
                "type": "PERSISTENT",
                "initializeParams": {
                    "sourceImage": disk["sourceImage"],
                    "diskSizeGb": str(int(disk["diskSizeGb"])),
                },
            }
        ],  # fmt: skip
        "networkInterfaces": inputs["networkInterfaces"],
        "serviceAccounts": [inputs["serviceAccount"]],
        "scheduling": inputs["scheduling"],
        "metadata": {
            "items": [{"key": k, "value": v} for k, v in sorted(inputs["metadata"].items())]
        },  # fmt: skip
        "tags": {"items": inputs["tags"]},
        "labels": inputs["labels"],
    }
    if "shieldedInstanceConfig" in inputs:
        props["shieldedInstanceConfig"] = inputs["shieldedInstanceConfig"]
    return props


@pytest.mark.parametrize("stack", COMPUTE_STACKS)
def test_the_spec_is_what_pulumi_declares(evaluations, stack):
    evaluation = evaluations[stack]
    spec = evaluation.values["node_spec"]
    assert spec["api"] == "compute"
    template = evaluation.one(TEMPLATE).inputs
    assert spec["template"] == {"name": template["name"], "properties": _template_as_rest(template)}
    policy = evaluation.one(POLICY).inputs
    assert spec["workload_policy"] == {k: policy[k] for k in
                                       ("name", "region", "description", "workloadPolicy")}  # fmt: skip
    group = evaluation.one(GROUP).inputs
    manager = spec["manager"]
    assert manager["instanceTemplate"].endswith(f"/instanceTemplates/{template['name']}")
    assert manager["resourcePolicies"]["workloadPolicy"].endswith(f"/{policy['name']}")
    for key in ("name", "baseInstanceName", "targetSize", "instanceLifecyclePolicy",
                "updatePolicy", "description"):  # fmt: skip
        assert manager[key] == group[key], key
    assert [manager["targetSizePolicy"]] == group["targetSizePolicies"]


@pytest.mark.parametrize("stack", COMPUTE_STACKS)
def test_google_s_client_takes_every_body(evaluations, stack):
    """Compute Engine v1's own types parse each body with no unknown field."""
    spec = evaluations[stack].values["node_spec"]
    for kind, body in ((compute_v1.ResourcePolicy, spec["workload_policy"]),
                       (compute_v1.InstanceTemplate, spec["template"]),
                       (compute_v1.InstanceGroupManager, spec["manager"])):  # fmt: skip
        parsed = kind.from_json(json.dumps(body), ignore_unknown_fields=False)
        assert parsed.name == body["name"]
    broken = {**spec["manager"], "targetSizePolicies": [{"mode": "BULK"}]}  # Terraform's name
    with pytest.raises(json_format.ParseError, match="targetSizePolicies"):  # negative control
        compute_v1.InstanceGroupManager.from_json(json.dumps(broken), ignore_unknown_fields=False)


@pytest.mark.parametrize("stack", COMPUTE_STACKS)
def test_outputs_and_the_watcher(evaluations, stack):
    """The outputs that name the group, and the watcher VM that recovers it (issue 51)."""
    evaluation, config = evaluations[stack], config_of(stack)
    values = evaluation.values
    assert values["slice_api"] == "compute" and values["num_hosts"] == config.accelerator.hosts
    assert (values["mig"], values["region"]) == (values["node_spec"]["manager"]["name"],
                                                 config.region)  # fmt: skip
    assert values["workload_policy"] == evaluation.one(POLICY).inputs["name"]
    assert values["instances_command"].startswith(
        f"gcloud compute instance-groups managed list-instances {values['mig']} --zone "
    )
    (watcher,) = evaluation.of_type("gcp:compute/instance:Instance")
    assert watcher.name == "watcher-vm" and values["watcher_instance"]
    assert not evaluation.of_type("gcp:tpu/v2Vm:V2Vm")


@pytest.mark.parametrize("stack", COMPUTE_STACKS)
def test_removing_spot_settings_or_the_workload_policy_is_seen(evaluations, stack):
    """Negative controls for the checks above: the rules see a template with an external IP."""
    template = evaluations[stack].one(TEMPLATE)
    assert policies.violations(template.type, template.inputs, template.protect) == []
    opened = json.loads(json.dumps(template.inputs))
    opened["networkInterfaces"][0]["accessConfigs"] = [{}]
    assert policies.violations(template.type, opened, template.protect)


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        ({"acceleratorType": "v5e-16", "api": "compute"},
         "tpupod:api: Compute Engine does not make v5e slices"),
        ({"acceleratorType": "tpu7x-16", "api": "tpu"},
         "tpupod:api: the Cloud TPU API does not make tpu7x slices"),
        ({"acceleratorType": "v6e-8", "api": "compute"}, "tpupod:api: v6e-8 is one VM"),
        ({"acceleratorType": "v6e-16", "api": "compute", "createVia": "queued"},
         "tpupod:createVia: queued resources exist only on the Cloud TPU API"),
        ({"acceleratorType": "tpu7x-16", "queueValidHours": "2"}, "tpupod:queueValidHours: "),
        ({"acceleratorType": "tpu7x-16", "runtimeVersion": "v2-alpha-tpuv6e"},
         "tpupod:runtimeVersion: names a Cloud TPU API runtime"),
        ({"acceleratorType": "tpu7x-16", "provisioning": "preemptible"},
         "tpupod:provisioning: preemptible is the Cloud TPU API's older tier"),
        ({"acceleratorType": "tpu7x-16", "zone": "us-central1-b"},
         "tpupod:zone: us-central1-b does not offer tpu7x on Compute Engine"),
        ({"acceleratorType": "v6e-16", "api": "gke"}, "tpupod:api: 'gke': use tpu"),
    ],
)  # fmt: skip
def test_a_combination_google_does_not_offer_is_one_line(raw, line):
    with pytest.raises(ConfigError) as err:
        parse({"gcp:project": "p", **raw}, stack="s")
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_a_combination_google_offers_is_taken():
    """The control for the refusals: each of them, put right, is accepted."""
    for raw in ({"acceleratorType": "v6e-16", "api": "compute", "createVia": "direct"},
                {"acceleratorType": "v6e-16", "api": "tpu", "createVia": "queued"},
                {"acceleratorType": "tpu7x-16", "provisioning": "on-demand"},
                {"acceleratorType": "v5p-16", "api": "compute", "zone": "us-east5-a"}):  # fmt: skip
        config = parse({"gcp:project": "p", **raw}, stack="s")
        assert config.resolved_api == raw.get("api", "compute")
    assert catalog.lookup("v5p-16").topology == "2x2x2"
