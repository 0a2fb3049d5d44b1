"""Rules for the watcher VM and its way in to the workers (infra/watcher_vm.py), as predicates over
(resource type, wire properties, protect) like every rule in `infra.policies`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

WATCHER_TAG_SUFFIX = "-watcher"


def no_external_ip(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    return [
        f"network interface {i} has an access config (an external IP)"
        for i, nic in enumerate(props.get("networkInterfaces") or [])
        if nic.get("accessConfigs") or nic.get("ipv6AccessConfigs")
    ]


def shielded_secure_boot(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    shielded = props.get("shieldedInstanceConfig") or {}
    return [] if shielded.get("enableSecureBoot") is True else ["VM without secure boot"]


def watcher_ssh_only(resource_type: str, props: Mapping[str, Any], protect: bool) -> list[str]:
    """A rule whose source is the watcher's tag opens tcp:22 and nothing else."""
    tags = [str(t) for t in props.get("sourceTags") or []]
    if not any(t.endswith(WATCHER_TAG_SUFFIX) for t in tags):
        return []
    opened = [
        (str(a.get("protocol", "")).lower(), [str(p) for p in a.get("ports") or []])
        for a in props.get("allows") or []
    ]
    if opened != [("tcp", ["22"])] or props.get("sourceRanges"):
        return [f"the watcher's tag may reach tcp:22 only, this rule opens {opened}"]
    return []
