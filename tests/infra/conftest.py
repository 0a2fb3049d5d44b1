"""Shared fixtures: every stack evaluated once, offline, under Pulumi mocks; golden inventories.

Golden inventories (tests/infra/golden/<stack>.json) are what each stack declares, normalized so
only intended changes show: the bundle hash (changes with every code edit) and the startup script
(owned by bootstrap/, asserted exactly elsewhere) become placeholders. After an intended change,
rewrite them with `TPUPOD_UPDATE_GOLDEN=1 uv run pytest tests/infra -q` and review the diff.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest

from contract import metadata
from infra import offline
from infra.watcher_vm import NODE_SPEC_KEY

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
UPDATE_ENV = "TPUPOD_UPDATE_GOLDEN"
TEMPLATE_HASH = re.compile(
    r"(instanceTemplates/tpupod-[a-z0-9-]+|^tpupod-[a-z0-9-]+)-[0-9a-f]{10}$"
)


@pytest.fixture(scope="session")
def evaluations() -> dict[str, offline.Evaluation]:
    return {stack: offline.evaluate(stack) for stack in offline.stack_names()}


@pytest.fixture
def golden() -> Callable[[offline.Evaluation], None]:
    """Check an evaluation against its stored inventory (or rewrite it under the env var)."""
    return check_golden


def inventory(evaluation: offline.Evaluation) -> dict[str, Any]:
    # The slice's metadata names the bundle: a TPU API node's, or a Compute Engine template's.
    bundle_sha256 = next(
        r.inputs["metadata"][metadata.BUNDLE_SHA256]
        for r in evaluation.resources
        if metadata.BUNDLE_SHA256 in (r.inputs.get("metadata") or {})
    )

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in sorted(value.items())}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, (pulumi.Asset, pulumi.Archive)):
            return f"<{type(value).__name__}>"
        if isinstance(value, str):  # a template's name holds a hash of what it holds
            return TEMPLATE_HASH.sub(
                r"\1-<template-hash>", value.replace(bundle_sha256, "<bundle-sha256>")
            )
        return value

    resources = []
    for r in evaluation.resources:
        if r.type.startswith("pulumi:providers:"):
            continue
        inputs = dict(r.inputs)
        if metadata.STARTUP_SCRIPT in (inputs.get("metadata") or {}):
            inputs["metadata"] = {**inputs["metadata"], metadata.STARTUP_SCRIPT: "<startup.sh>"}
        if NODE_SPEC_KEY in (inputs.get("metadata") or {}):  # the watcher's copy of node_spec
            spec = json.loads(inputs["metadata"][NODE_SPEC_KEY])
            if "node" in spec:
                spec["node"]["metadata"][metadata.STARTUP_SCRIPT] = "<startup.sh>"
            else:  # a Compute Engine spec: the template's metadata items
                for item in spec["template"]["properties"]["metadata"]["items"]:
                    if item["key"] == metadata.STARTUP_SCRIPT:
                        item["value"] = "<startup.sh>"
            # cleaned as a value (the template's name holds a hash of the code bundle's)
            inputs["metadata"] = {**inputs["metadata"], NODE_SPEC_KEY: json.dumps(clean(spec))}
        resource = {
            "type": r.type,
            "name": r.name,
            "parent": r.parent.rsplit("::", 1)[-1] if r.parent else "",
            "protect": r.protect,
            "delete_before_replace": r.delete_before_replace,
            "create_timeout": r.create_timeout,
            "inputs": clean(inputs),
        }
        if r.hooks:  # resource hooks bound (the slice's before_delete)
            resource["hooks"] = {kind: list(names) for kind, names in r.hooks.items()}
        resources.append(resource)
    resources.sort(key=lambda item: (item["type"], item["name"]))
    outputs = dict(evaluation.values)
    spec = outputs.get("node_spec")
    if spec and "node" in spec:  # its metadata carries the startup script too
        node_metadata = {**spec["node"]["metadata"], metadata.STARTUP_SCRIPT: "<startup.sh>"}
        outputs["node_spec"] = {**spec, "node": {**spec["node"], "metadata": node_metadata}}
    elif spec:  # a Compute Engine spec: the template's metadata items
        props = spec["template"]["properties"]
        items = [{**i, "value": "<startup.sh>"} if i["key"] == metadata.STARTUP_SCRIPT else i
                 for i in props["metadata"]["items"]]  # fmt: skip
        template = {**spec["template"], "properties": {**props, "metadata": {"items": items}}}
        outputs["node_spec"] = {**spec, "template": template}
    return {"stack": evaluation.stack, "resources": resources, "outputs": clean(outputs)}


def check_golden(evaluation: offline.Evaluation) -> None:
    path = GOLDEN_DIR / f"{evaluation.stack}.json"
    actual = inventory(evaluation)
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(actual, indent=2, sort_keys=True) + "\n")
        return
    assert path.exists(), f"no golden inventory for {evaluation.stack}; run with {UPDATE_ENV}=1"
    expected = json.loads(path.read_text())
    assert actual == expected, (
        f"{evaluation.stack}'s resources changed; if intended, rerun with {UPDATE_ENV}=1 and "
        "review the diff of tests/infra/golden/"
    )
