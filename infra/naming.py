"""Names and labels derived from the stack, so two stacks never collide and nothing is random.

Explicit names matter: the TPU name is what ops and `gcloud ... ssh` address, and a fixed name
plus `delete_before_replace` keeps one slice's quota instead of two during a replacement.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Protocol


class StackConfig(Protocol):
    """What names are made of: infra.config.StackConfig has it (which validates with these names,
    so this module cannot import it)."""

    stack: str
    project: str
    run_id: str
    existing_bucket: str | None
    bucket_name: str | None
    accelerator: Any  # a catalog.Accelerator (its .name)


GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"[^a-z0-9_-]+")
# Whose a TPU node is: the node spec carries these labels, so every node and queued request
# recovery creates from it is found by them (infra.cleanup), in any zone, after any move.
STACK_LABEL = "tpupod-stack"
RUN_LABEL = "tpupod-run"


def gce_name(*parts: str) -> str:
    """A valid GCE resource name (lowercase letter first, letters/digits/dashes, <= 63 chars)."""
    base = re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")
    base = re.sub(r"-{2,}", "-", base)
    if not base or not base[0].isalpha():
        base = f"tp-{base}".rstrip("-")
    if len(base) > 63:
        digest = hashlib.sha256(base.encode()).hexdigest()[:6]
        base = f"{base[:56].rstrip('-')}-{digest}"
    assert GCE_NAME.match(base), base
    return base


def tpu_name(config: StackConfig) -> str:
    return gce_name("tpupod", config.stack)


def network_tag(config: StackConfig) -> str:
    """Tag on every worker; firewall rules select workers by it (per stack, so shared VPCs work)."""
    return gce_name("tpupod", config.stack, "worker")


def bucket_name(config: StackConfig) -> str:
    """The checkpoint bucket: stack's choice, an existing bucket, or project+stack (global names)."""
    if config.existing_bucket:
        return config.existing_bucket
    if config.bucket_name:
        return config.bucket_name
    return gce_name(config.project, "tpupod", config.stack)


def service_account_id(config: StackConfig) -> str:
    """6-30 characters, lowercase letter first (IAM account id rules)."""
    base = gce_name("tpupod", config.stack)[:30].rstrip("-")
    return base if len(base) >= 6 else f"{base}-sa"


def labels(config: StackConfig) -> dict[str, str]:
    return {
        STACK_LABEL: label_value(config.stack),
        "tpupod-accelerator": label_value(config.accelerator.name),
        "managed-by": "pulumi",
    }


def node_labels(config: StackConfig) -> dict[str, str]:
    """The slice's: the stack's labels and the run's (a node outlives no run unnoticed)."""
    return {**labels(config), **owner_labels(config.stack, config.run_id)}


def owner_labels(stack: str, run_id: str) -> dict[str, str]:
    """What makes a node tpupod's: its stack and run (the local pod's node spec has these)."""
    return {STACK_LABEL: label_value(stack), RUN_LABEL: label_value(run_id)}


def label_value(value: str) -> str:
    """A valid GCE label value: lowercase letters, digits, `_` and `-`, at most 63."""
    return _LABEL_VALUE.sub("-", value.lower())[:63]
