"""What tpupod owns in the Cloud TPU API, found by label, and its removal: nothing bills after
destroy.

Recovery creates nodes and queued resources outside Pulumi's state, in any zone of
`tpupod:zones`, so ownership is a label, not a name: every node it creates comes from the node
spec, which carries the stack's labels (infra.naming.owner_labels). A node is ours when its
`tpupod-stack` label names the stack; a queued resource, which has no labels of its own in
tpu_v2, when the node its `tpu.nodeSpec` asks for does. `remove_owned` deletes them all, zone by
zone: requests first, with `force` (each takes its node along), then the nodes left, and waits
until none is listed. The slice's `before_delete` hook calls it at `pulumi destroy --run-program`
(infra.tpu_slice, Application Default Credentials), `tpupod local down` with the operator's
token; `tpupod status --all` shows `list_owned`. Google's client (google-cloud-tpu, REST) is the
only dependency, imported on first use.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from infra.naming import RUN_LABEL, STACK_LABEL, label_value

# As long as pulumi-gcp waits for a V2Vm's delete (the provider's default delete timeout).
DELETE_TIMEOUT_S = 20 * 60
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
POLL_INITIAL_S = 0.2
POLL_MAXIMUM_S = 10.0
NODE = "node"
QUEUED = "queued resource"
HINTS = {
    401: "no valid credentials: `gcloud auth application-default login`",
    403: "the caller needs tpu.nodes.list and tpu.nodes.delete (roles/tpu.admin)",
}


class CleanupError(Exception):
    """A listing or a delete refused, or not done in time: one line, what and why."""


@dataclass(frozen=True)
class Owned:
    """A node or queued resource of the stack, as the TPU API listed it."""

    kind: str  # NODE or QUEUED
    name: str  # projects/P/locations/Z/nodes/N (or .../queuedResources/Q)
    state: str  # Node.State or QueuedResourceState.State name
    run: str = ""  # its tpupod-run label

    @property
    def zone(self) -> str:
        return self.name.split("/")[3]

    @property
    def id(self) -> str:
        return self.name.rsplit("/", 1)[1]

    def line(self) -> str:
        run = f", run {self.run}" if self.run else ""
        return f"{self.kind} {self.id} in {self.zone} ({self.state}{run})"


@dataclass(frozen=True)
class Removal:
    """What `remove_owned` deleted (each as it was listed before its delete)."""

    deleted: tuple[Owned, ...]
    where: str = "the TPU API"

    def lines(self) -> list[str]:
        if not self.deleted:
            return [f"nothing of the stack's was left in {self.where}"]
        return [f"deleted {owned.line()}" for owned in self.deleted]


def owns(labels: Mapping[str, str], stack: str) -> bool:
    return labels.get(STACK_LABEL) == label_value(stack)


def list_owned(client, project: str, zones: Iterable[str], stack: str) -> list[Owned]:
    """Every queued resource, then every node, of `stack` in each zone (in the zones' order)."""
    from google.cloud import tpu_v2

    found: list[Owned] = []
    for zone in dict.fromkeys(zones):
        parent = f"projects/{project}/locations/{zone}"
        for request in _listed(client.list_queued_resources, parent, "queued resources"):
            nodes = [spec.node for spec in request.tpu.node_spec]
            if any(owns(node.labels, stack) for node in nodes):
                state = tpu_v2.QueuedResourceState.State(request.state.state).name
                run = next((n.labels.get(RUN_LABEL, "") for n in nodes), "")
                found.append(Owned(QUEUED, request.name, state, run))
        for node in _listed(client.list_nodes, parent, "nodes"):
            if owns(node.labels, stack):
                state = tpu_v2.Node.State(node.state).name
                found.append(Owned(NODE, node.name, state, node.labels.get(RUN_LABEL, "")))
    return found


def remove_owned(client, project: str, zones: Iterable[str], stack: str, *,
                 timeout_s: float = DELETE_TIMEOUT_S) -> Removal:  # fmt: skip
    """Delete everything `list_owned` finds; return once none is listed. CleanupError on a
    refusal or after `timeout_s`, naming what is still there."""
    zones = list(dict.fromkeys(zones))
    deadline = time.monotonic() + timeout_s
    deleted: list[Owned] = []
    for kind in (QUEUED, NODE):  # a request's forced delete takes its node: nodes come after
        started = []
        for owned in list_owned(client, project, zones, stack):
            if owned.kind == kind and owned.state != "DELETING":
                operation = _start_delete(client, owned)
                if operation is not None:
                    started.append((owned, operation))
                    deleted.append(owned)
        for owned, operation in started:
            _wait(operation, owned, deadline)
    while left := list_owned(client, project, zones, stack):  # those already DELETING too
        if time.monotonic() > deadline:
            raise CleanupError(f"still there after {timeout_s:.0f} s: "
                               + "; ".join(o.line() for o in left))  # fmt: skip
        time.sleep(POLL_INITIAL_S)
    return Removal(tuple(deleted))


def _listed(method, parent: str, what: str) -> list:
    from google.api_core import exceptions

    try:
        return list(method(parent=parent))
    except exceptions.GoogleAPICallError as err:
        raise CleanupError(_refusal(err, f"cannot list {what} in {parent}")) from None


def _start_delete(client, owned: Owned):
    """The delete's operation; None when it is gone already."""
    from google.api_core import exceptions

    try:
        if owned.kind == QUEUED:
            return client.delete_queued_resource(request={"name": owned.name, "force": True})
        return client.delete_node(name=owned.name)
    except exceptions.NotFound:
        return None
    except exceptions.GoogleAPICallError as err:
        raise CleanupError(_refusal(err, f"cannot delete {owned.line()}")) from None


def _wait(operation, owned: Owned, deadline: float) -> None:
    from google.api_core import exceptions
    from google.api_core.future import polling

    fast = polling.DEFAULT_POLLING.with_delay(initial=POLL_INITIAL_S, maximum=POLL_MAXIMUM_S)
    remaining = max(deadline - time.monotonic(), POLL_INITIAL_S)
    try:
        operation.result(timeout=remaining, polling=fast)
    except exceptions.NotFound:
        pass  # gone before the operation could say so
    except exceptions.GoogleAPICallError as err:
        raise CleanupError(_refusal(err, f"delete of {owned.line()} failed")) from None
    except TimeoutError:
        raise CleanupError(f"delete of {owned.line()} not done after the deadline") from None


def _refusal(err, doing: str) -> str:
    """One line: what was refused, Google's status and message, and what to grant or fix."""
    code = f"{err.code} " if err.code else ""
    hint = HINTS.get(err.code)
    return f"{doing}: {code}{err.message}" + (f" ({hint})" if hint else "")


def google_client():
    """A TpuClient on Google's endpoint with Application Default Credentials (the Pulumi
    program's own: what `pulumi destroy` runs with)."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import tpu_v2

    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
    except DefaultCredentialsError:
        raise CleanupError(f"no Application Default Credentials: {HINTS[401]}") from None
    return tpu_v2.TpuClient(transport="rest", credentials=credentials)
