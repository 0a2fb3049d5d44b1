"""The slice's delete hook and the labels it goes by, as every stack declares them (offline, under
Pulumi's mocks: hooks are registered there but never called; tests/localpod/
test_destroy_leaves_nothing.py calls the hook's function against a local pod)."""

from __future__ import annotations

import re

import pytest
from pulumi.runtime.proto import resource_pb2

from infra import naming, offline

V2VM = "gcp:tpu/v2Vm:V2Vm"
# GCE's rule for a label value: lowercase letters, digits, `_` and `-`, at most 63 characters.
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


@pytest.mark.parametrize("stack", offline.stack_names(api="tpu"))
def test_the_slice_carries_the_delete_hook_registered_once(evaluations, stack):
    evaluation = evaluations[stack]
    node = evaluation.one(V2VM)
    name = f"{node.inputs['name']}-delete-owned"
    assert node.hooks == {"before_delete": (name,)}
    assert evaluation.hooks == [name]  # the program registers it, once: the engine needs that
    assert [r.name for r in evaluation.resources if r.hooks] == [node.name]


@pytest.mark.parametrize("stack", offline.stack_names(api="tpu"))
def test_the_watcher_goes_before_the_slice(evaluations, stack):
    """At destroy the engine deletes a resource's dependents first: the watcher VM is gone before
    the slice's hook runs, so no recovery re-creates what the hook removes."""
    evaluation = evaluations[stack]
    node = evaluation.one(V2VM)
    watcher = [r for r in evaluation.resources if r.type == "gcp:compute/instance:Instance"]
    assert watcher and all(node.urn in vm.dependencies for vm in watcher)


@pytest.mark.parametrize("stack", offline.stack_names(api="tpu"))
def test_the_node_and_its_spec_carry_the_stack_and_the_run(evaluations, stack):
    evaluation = evaluations[stack]
    labels = evaluation.one(V2VM).inputs["labels"]
    assert labels[naming.STACK_LABEL] == stack and labels[naming.RUN_LABEL] == "main"
    assert evaluation.values["node_spec"]["node"]["labels"] == labels  # what recovery creates


def test_a_run_id_becomes_a_valid_label_value():
    config = offline.stack_config("v4-8") | {"tpupod:runId": "2026.11-a_b"}
    labels = offline.evaluate("v4-8", config).one(V2VM).inputs["labels"]
    assert labels[naming.RUN_LABEL] == "2026-11-a_b"
    assert all(LABEL_VALUE.match(value) for value in labels.values()), labels


def test_the_recording_monitor_refuses_a_hook_registered_twice():
    """As the engine does (`resource hook already registered for name`); the SDK's mock does not."""
    monitor = offline.RecordingMonitor(offline.CloudMocks())
    monitor.RegisterResourceHook(resource_pb2.RegisterResourceHookRequest(name="h"))
    with pytest.raises(ValueError, match="already registered for name 'h'"):
        monitor.RegisterResourceHook(resource_pb2.RegisterResourceHookRequest(name="h"))
