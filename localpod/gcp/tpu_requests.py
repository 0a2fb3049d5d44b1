"""Requests to the pod's Cloud TPU v2 API checked as Google checks them: known field names at
every depth (camelCase or snake_case), string maps, a valid node id, and an accelerator type this
pod can play. Errors are google.rpc statuses, mapped to HTTP as Google's REST front end maps them.
"""

from __future__ import annotations

import re

from infra import catalog
from localpod.gcp.gcp_errors import HTTP_STATUS, ApiError  # noqa: F401 - re-exported
from localpod.vm.metadata_server import PROJECT_NUMBER, ZONE

# Node fields a request may set; the output-only ones are ignored, as Google does.
INPUT_FIELDS = frozenset((
    "description", "acceleratorType", "runtimeVersion", "networkConfig", "networkConfigs",
    "serviceAccount", "schedulingConfig", "labels", "metadata", "tags", "dataDisks",
    "shieldedInstanceConfig", "acceleratorConfig", "multisliceNode",
))  # fmt: skip
OUTPUT_ONLY = frozenset((
    "name", "state", "healthDescription", "cidrBlock", "createTime", "networkEndpoints", "health",
    "id", "apiVersion", "symptoms", "queuedResource",
))  # fmt: skip
# The Node's message-typed fields and the names inside them (tpu_v2 JSON names): Google's parser
# refuses an unknown name at any depth.
MESSAGE_FIELDS = {
    "networkConfig": {"network", "subnetwork", "enableExternalIps", "canIpForward", "queueCount"},
    "serviceAccount": {"email", "scope"},
    "schedulingConfig": {"preemptible", "reserved", "spot"},
    "shieldedInstanceConfig": {"enableSecureBoot"},
    "acceleratorConfig": {"type", "topology"},
}
NODE_ID = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


def not_found(name: str) -> ApiError:
    """NOT_FOUND for a resource name, worded as the TPU API words it."""
    return ApiError("NOT_FOUND", f'Resource "{name}" was not found.')


def quota_exceeded(broken: list[tuple[str, int, str]]) -> ApiError:
    """A create refused for quota, as the TPU API answers it: HTTP 429 RESOURCE_EXHAUSTED, every
    quota broken ((name, limit, "region R" or "zone Z")) named in the message, joined by commas,
    and one QuotaFailure violation each (no ErrorInfo: captured 429s of nodes.create have none)."""
    names, limits, places = (",".join(str(b[i]) for b in broken) for i in range(3))
    violations = [{"subject": f"project:{PROJECT_NUMBER}",
                   "description": f"Quota '{name}' exhausted. Limit {limit} in {place}"}
                  for name, limit, place in broken]  # fmt: skip
    return ApiError(
        "RESOURCE_EXHAUSTED",
        f"Quota limit '{names}' has been exceeded. Limit: {limits} in {places}.",
        [{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": violations}],
    )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _unknown(key: str, where: str) -> ApiError:
    return ApiError(
        "INVALID_ARGUMENT",
        f"Invalid JSON payload received. Unknown name \"{key}\" at '{where}': Cannot find field.",
    )


def _message(field: str, value: object) -> dict:
    """A message-typed field with its names checked and spelled as the REST API does."""
    where = "node." + re.sub(r"(?<!^)(?=[A-Z])", "_", field).lower()
    if not isinstance(value, dict):
        raise ApiError("INVALID_ARGUMENT", f"Invalid value at '{where}': expected an object.")
    known = MESSAGE_FIELDS[field]
    for key in value:
        if _camel(key) not in known:
            raise _unknown(key, where)
    return {_camel(key): item for key, item in value.items()}


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def catalog_hosts(accelerator: object) -> int | None:
    """Hosts a real accelerator type needs (infra.catalog); None for a name the API does not
    take (the API takes `v5litepod-16`, not the user-facing `v5e-16`)."""
    try:
        found = catalog.lookup(accelerator) if isinstance(accelerator, str) else None
    except catalog.CatalogError:
        return None
    # TPU7x comes only through Compute Engine: the TPU API refuses it as a type it does not offer.
    offered = found is not None and found.generation.tpu_api and found.api_type == accelerator
    return found.hosts if offered else None


def check_node_id(node_id: str | None) -> None:
    if not node_id or not NODE_ID.fullmatch(node_id):
        raise ApiError(
            "INVALID_ARGUMENT",
            f"nodeId {node_id!r} is invalid: lowercase letters, digits and hyphens, "
            "starting with a letter, at most 63 characters.",
        )


def node_request(body: dict, pod_accelerator: str, workers: int) -> dict:
    """The request's Node with Google's checks: known names, string maps, our accelerator."""
    if not isinstance(body, dict):
        raise ApiError("INVALID_ARGUMENT", "Invalid JSON payload received: expected a Node.")
    request = {}
    for key, value in body.items():
        field = _camel(key)
        if field in OUTPUT_ONLY:
            continue
        if field not in INPUT_FIELDS:
            raise _unknown(key, "node")
        request[field] = _message(field, value) if field in MESSAGE_FIELDS else value
    for field in ("metadata", "labels"):
        value = request.get(field, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ApiError("INVALID_ARGUMENT", f"node.{field} must map strings to strings.")
    check_accelerator(request.get("acceleratorType"), pod_accelerator, workers)
    return request


def check_accelerator(accelerator: object, pod_accelerator: str, workers: int) -> None:
    """The pod's own `cpu-N`, or a catalog type needing as many hosts as the pod has workers."""
    if accelerator == pod_accelerator:
        return
    hosts = catalog_hosts(accelerator)
    if hosts is None:
        raise ApiError(
            "INVALID_ARGUMENT",
            f"node.acceleratorType {accelerator!r} is not offered in zone {ZONE}: "
            f"this pod's workers make {pod_accelerator!r}.",
        )
    if hosts != workers:
        raise ApiError(
            "INVALID_ARGUMENT",
            f"node.acceleratorType {accelerator!r} needs {_count(hosts, 'host')}, this pod "
            f"has {_count(workers, 'worker')}: start a pod of that size with "
            f"`tpupod local up --workers {hosts}`.",
        )
