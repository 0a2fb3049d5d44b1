"""The pod's own calls to its Cloud TPU API, made with Google's client exactly as ops makes them.

google-cloud-tpu over REST with the operator's token (what `pulumi up` runs as) at the pod's
`tpu_api`; imported lazily because the client library takes a second or two to import.
"""

from __future__ import annotations

import json

from localpod.gcp.identities import operator_token
from localpod.state import PodError

POLL_INITIAL_S = 0.1
POLL_MAXIMUM_S = 1.0


def client(endpoints: dict):
    """A TpuClient for the pod whose endpoints.json is `endpoints`."""
    from google.cloud import tpu_v2
    from google.oauth2.credentials import Credentials

    return tpu_v2.TpuClient(
        transport="rest",
        credentials=Credentials(token=operator_token(endpoints)),
        client_options={"api_endpoint": endpoints["tpu_api"].rstrip("/")},
    )


def _wait(operation, timeout: float | None, what: str):
    """The operation's result within `timeout` (None: do not wait); errors as PodError."""
    from google.api_core import exceptions
    from google.api_core.future import polling

    if timeout is None:
        return None
    fast = polling.DEFAULT_POLLING.with_delay(initial=POLL_INITIAL_S, maximum=POLL_MAXIMUM_S)
    try:
        return operation.result(timeout=timeout, polling=fast)
    except exceptions.GoogleAPICallError as err:
        raise PodError(f"{what} failed: {err.message}") from None
    except TimeoutError:
        raise PodError(f"{what} not done after {timeout:.0f} s") from None


def create_node(endpoints: dict, spec: dict, timeout: float | None):
    """nodes.create from a node spec (Contract 2); the Node once READY when waiting."""
    from google.api_core import exceptions
    from google.cloud import tpu_v2

    node = tpu_v2.Node.from_json(json.dumps(spec["node"]))
    try:
        operation = client(endpoints).create_node(
            parent=spec["parent"], node_id=spec["node_id"], node=node
        )
    except exceptions.GoogleAPICallError as err:
        raise PodError(f"cannot create node {spec['node_id']}: {err.message}") from None
    return _wait(operation, timeout, f"create of node {spec['node_id']}")


def create_queued(endpoints: dict, spec: dict, timeout: float | None):
    """A queued resource for the spec's node, as gcloud's `queued-resources create` files one
    (the node whole; a spot node as the spot tier, with no schedulingConfig); with a `timeout`,
    waits until the request is ACTIVE (its node READY). The pod's own code: the local cloud
    shares none with ops."""
    import time

    from google.api_core import exceptions
    from google.cloud import tpu_v2

    node = dict(spec["node"])
    spot = (node.get("schedulingConfig") or {}).get("spot")
    if spot:
        node.pop("schedulingConfig")
    body = {"tpu": {"nodeSpec": [{"parent": spec["parent"], "nodeId": spec["node_id"],
                                  "node": node}]}}  # fmt: skip
    if spot:
        body["spot"] = {}
    tpu = client(endpoints)
    name = f"{spec['parent']}/queuedResources/{spec['node_id']}"
    try:
        operation = tpu.create_queued_resource(
            parent=spec["parent"], queued_resource_id=spec["node_id"],
            queued_resource=tpu_v2.QueuedResource.from_json(json.dumps(body)),
        )  # fmt: skip
        _wait(operation, timeout, f"queued resource {spec['node_id']}")
        deadline = time.monotonic() + (timeout or 0)
        while timeout is not None:
            raw = tpu.get_queued_resource(name=name).state.state
            state = getattr(raw, "name", str(raw))  # a bare int: a state the client lacks
            if state == "ACTIVE":
                return raw
            if state in ("FAILED", "SUSPENDED") or time.monotonic() > deadline:
                raise PodError(f"queued resource {spec['node_id']} {state}")
            time.sleep(POLL_INITIAL_S)
    except exceptions.GoogleAPICallError as err:
        raise PodError(f"cannot file queued resource {spec['node_id']}: {err.message}") from None
    return None


def delete_node(endpoints: dict, timeout: float | None) -> None:
    """nodes.delete of the pod's node, whatever its name; PodError when there is none."""
    from google.api_core import exceptions

    tpu = client(endpoints)
    parent = f"projects/{endpoints['project']}/locations/-"  # the node may be in any zone
    try:
        nodes = list(tpu.list_nodes(parent=parent))
        if not nodes:
            raise PodError("cannot delete: there is no node")
        operation = tpu.delete_node(name=nodes[0].name)
    except exceptions.GoogleAPICallError as err:
        raise PodError(f"cannot delete: {err.message}") from None
    _wait(operation, timeout, f"delete of {nodes[0].name}")


def delete_owned(endpoints: dict, stack: str, zones, timeout: float):
    """infra.cleanup.remove_owned in the pod's project and `zones`: what `pulumi destroy`'s hook
    does on GCP, here with the operator's token."""
    from infra import cleanup

    return cleanup.remove_owned(client(endpoints), endpoints["project"], zones, stack,
                                timeout_s=timeout)  # fmt: skip


def patch_metadata(endpoints: dict, name: str, metadata: dict[str, str], timeout: float = 60.0):
    """nodes.patch with update_mask `metadata` (the whole map, as `pulumi up` sends it)."""
    from google.api_core import exceptions
    from google.cloud import tpu_v2
    from google.protobuf import field_mask_pb2

    node = tpu_v2.Node(name=name, metadata=metadata)
    try:
        operation = client(endpoints).update_node(
            node=node, update_mask=field_mask_pb2.FieldMask(paths=["metadata"])
        )
    except exceptions.GoogleAPICallError as err:
        raise PodError(f"cannot update node {name}: {err.message}") from None
    return _wait(operation, timeout, f"update of node {name}")
