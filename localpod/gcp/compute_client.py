"""The pod's own calls to its Compute Engine API, made with Google's client (google-cloud-compute
over REST, the operator's token at the pod's `compute_api`): what `pulumi up` does for a slice
through Compute Engine (the workload policy, the template, the group), and what `pulumi destroy`
undoes. The pod's own code: the local cloud shares none with ops."""

from __future__ import annotations

import contextlib
import json
import time

from localpod.gcp.identities import operator_token
from localpod.state import PodError

POLL_S = 0.1


def _clients(endpoints: dict):
    from google.cloud import compute_v1
    from google.oauth2.credentials import Credentials

    options = {"api_endpoint": endpoints["compute_api"].rstrip("/")}
    creds = Credentials(token=operator_token(endpoints))

    def make(cls):
        return cls(transport="rest", credentials=creds, client_options=options)

    return (make(compute_v1.ResourcePoliciesClient), make(compute_v1.InstanceTemplatesClient),
            make(compute_v1.InstanceGroupManagersClient))  # fmt: skip


def delete_owned(endpoints: dict, spec: dict, zones, timeout: float):
    """infra.group_cleanup.remove_groups of the spec's group in `zones`: what the group's
    before_delete hook does at `pulumi destroy` on GCP, here with the operator's token."""
    from infra import group_cleanup

    _, _, groups = _clients(endpoints)
    return group_cleanup.remove_groups(groups, spec["project"], zones, spec["manager"]["name"],
                                       timeout_s=timeout)  # fmt: skip


def create_mig(endpoints: dict, spec: dict, timeout: float | None) -> None:
    """The spec's workload policy and template (kept when they exist, as `pulumi up` leaves
    them), then its group; with a `timeout`, waits until every VM is RUNNING."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    policies, templates, groups = _clients(endpoints)
    project, region, zone = spec["project"], spec["region"], spec["zone"]
    manager = spec["manager"]
    try:
        with contextlib.suppress(exceptions.Conflict):
            policies.insert(project=project, region=region,
                            resource_policy_resource=compute_v1.ResourcePolicy.from_json(
                                json.dumps(spec["workload_policy"]))).result(timeout=30)  # fmt: skip
        with contextlib.suppress(exceptions.Conflict):
            templates.insert(project=project,
                             instance_template_resource=compute_v1.InstanceTemplate.from_json(
                                 json.dumps(spec["template"]))).result(timeout=30)  # fmt: skip
        groups.insert(project=project, zone=zone,
                      instance_group_manager_resource=compute_v1.InstanceGroupManager.from_json(
                          json.dumps(manager))).result(timeout=30)  # fmt: skip
    except exceptions.GoogleAPICallError as err:
        raise PodError(f"cannot create group {manager['name']}: {err.message}") from None
    if timeout is None:
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            listed = list(groups.list_managed_instances(
                project=project, zone=zone, instance_group_manager=manager["name"]))  # fmt: skip
        except exceptions.GoogleAPICallError as err:
            raise PodError(f"group {manager['name']}: {err.message}") from None
        refused = [e for m in listed for e in m.last_attempt.errors.errors]
        if refused:
            raise PodError(f"group {manager['name']}: {refused[0].code}: {refused[0].message}")
        states = [(m.current_action, m.instance_status) for m in listed]
        if states and all(s == ("NONE", "RUNNING") for s in states):
            return
        if time.monotonic() > deadline:
            shown = ", ".join(f"{a}/{st or '-'}" for a, st in states) or "none"
            raise PodError(f"group {manager['name']}: VMs ({shown}) not RUNNING after "
                           f"{timeout:.0f} s")  # fmt: skip
        time.sleep(POLL_S)


def delete_mig(endpoints: dict, spec: dict, timeout: float | None) -> bool:
    """instanceGroupManagers.delete of the spec's group in every zone it may be in (recovery
    moves it); False when there is none. With a `timeout`, as `pulumi destroy`'s hook removes
    groups (infra.group_cleanup), waiting until none is left."""
    from google.api_core import exceptions

    from infra import group_cleanup
    from infra.cleanup import CleanupError

    _, _, groups = _clients(endpoints)
    project, name = spec["project"], spec["manager"]["name"]
    zones = [spec["zone"], *(spec.get("capacity") or {}).get("zones", [])]
    if timeout is not None:
        try:
            removal = group_cleanup.remove_groups(groups, project, zones, name, timeout_s=timeout)
        except CleanupError as err:
            raise PodError(f"cannot delete group {name}: {err}") from None
        return bool(removal.deleted)
    found = False
    for zone in dict.fromkeys(zones):
        try:
            groups.delete(project=project, zone=zone, instance_group_manager=name)
            found = True
        except exceptions.NotFound:
            continue
        except exceptions.GoogleAPICallError as err:
            raise PodError(f"cannot delete group {name} in {zone}: {err.message}") from None
    return found
