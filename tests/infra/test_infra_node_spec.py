"""The exported node spec (Contract 2) is what the V2Vm declares, in the TPU API's own JSON.

Every stack is evaluated under Pulumi mocks; Google's client library parses the spec, and the
V2Vm's wire inputs, mapped field by field to the REST names, equal the spec's node: the spec
ops recreates a node from cannot drift from what Pulumi created.
"""

from __future__ import annotations

import json

import pytest
from google.cloud import tpu_v2

from infra import offline
from infra.node_spec import resource_path

STACKS = offline.stack_names(api="tpu")  # a Compute Engine spec: test_infra_mig_slice
TPU = "gcp:tpu/v2Vm:V2Vm"


def v2vm_as_node_json(inputs: dict) -> dict:
    """The V2Vm's wire inputs under the REST Node's field names (only `scopes` -> `scope`)."""
    account = inputs["serviceAccount"]
    node = {
        "acceleratorType": inputs["acceleratorType"],
        "runtimeVersion": inputs["runtimeVersion"],
        "description": inputs["description"],
        "networkConfig": inputs["networkConfig"],
        "serviceAccount": {"email": account["email"], "scope": account["scopes"]},
        "schedulingConfig": inputs.get("schedulingConfig") or {},
        "metadata": inputs["metadata"],
        "labels": inputs["labels"],
        "tags": inputs["tags"],
    }
    if "shieldedInstanceConfig" in inputs:
        node["shieldedInstanceConfig"] = inputs["shieldedInstanceConfig"]
    return node


@pytest.mark.parametrize("stack", STACKS)
def test_spec_is_a_node_google_accepts(evaluations, stack):
    spec = evaluations[stack].values["node_spec"]
    node = tpu_v2.Node.from_json(json.dumps(spec["node"]))  # ParseError on any unknown field
    request = tpu_v2.CreateNodeRequest(parent=spec["parent"], node_id=spec["node_id"], node=node)
    v2vm = evaluations[stack].one(TPU).inputs
    assert request.parent == f"projects/{v2vm['project']}/locations/{v2vm['zone']}"
    assert request.node_id == v2vm["name"]
    assert node.metadata["startup-script"] == v2vm["metadata"]["startup-script"]
    assert node.service_account.scope == ["https://www.googleapis.com/auth/cloud-platform"]
    assert node.scheduling_config.spot


@pytest.mark.parametrize("stack", STACKS)
def test_spec_equals_what_the_v2vm_declares(evaluations, stack):
    spec = evaluations[stack].values["node_spec"]
    v2vm = evaluations[stack].one(TPU).inputs
    assert spec["node"]["metadata"] == v2vm["metadata"]
    assert spec["node"] == v2vm_as_node_json(v2vm)


SELF_LINK = "https://www.googleapis.com/compute/v1/projects/p/global/networks/shared"


def test_an_existing_network_self_link_becomes_the_api_path():
    config = {
        **offline.stack_config("v6e-8"),
        "tpupod:existingNetwork": SELF_LINK,
        "tpupod:existingSubnet": "projects/p/regions/us-east5/subnetworks/tpu",
    }
    evaluation = offline.evaluate("v6e-8", config)
    network_config = evaluation.values["node_spec"]["node"]["networkConfig"]
    assert network_config == {
        "network": "projects/p/global/networks/shared",
        "subnetwork": "projects/p/regions/us-east5/subnetworks/tpu",
        "enableExternalIps": False,
    }
    assert evaluation.one(TPU).inputs["networkConfig"] == network_config


@pytest.mark.parametrize(
    ("provisioning", "scheduling"),
    [("preemptible", {"preemptible": True}), ("on-demand", {}), ("reserved", {"reserved": True})],
)
def test_scheduling_follows_provisioning(provisioning, scheduling):
    config = {**offline.stack_config("v4-8"), "tpupod:provisioning": provisioning}
    spec = offline.evaluate("v4-8", config).values["node_spec"]
    assert spec["node"]["schedulingConfig"] == scheduling
    tpu_v2.Node.from_json(json.dumps(spec["node"]))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("default", "default"),
        ("projects/p/global/networks/n", "projects/p/global/networks/n"),
        (
            "https://compute.googleapis.com/compute/beta/projects/p/global/networks/n",
            "projects/p/global/networks/n",
        ),
    ],
)
def test_resource_path(given, expected):
    assert resource_path(given) == expected
