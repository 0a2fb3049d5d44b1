"""A Compute Engine slice's groups outside Pulumi's state, and their removal: nothing bills after
destroy on that path either.

Recovery re-creates the slice's managed instance group (same name, from the stack's spec) in any
zone of `tpupod:zones`; Pulumi's state knows only the one it declared. A group is the stack's
when it has the slice's name in one of those zones (groups carry no labels of their own).
`remove_groups` deletes them (`skip_zone`: the declared one, which Pulumi deletes itself) and
waits until none is left; the group's `before_delete` hook (infra.mig_slice) calls it at
`pulumi destroy --run-program`, `tpupod local down` on the local pod, and `tpupod status --all`
shows `list_groups`. Google's client (google-cloud-compute, REST), imported on first use.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from infra.cleanup import DELETE_TIMEOUT_S, POLL_INITIAL_S, CleanupError, Owned, Removal

GROUP = "instance group"


def list_groups(client, project: str, zones: Iterable[str], name: str) -> list[Owned]:
    """The group `name` in each of `zones` where there is one (an InstanceGroupManagersClient)."""
    from google.api_core import exceptions

    found = []
    for zone in dict.fromkeys(zones):
        try:
            group = client.get(project=project, zone=zone, instance_group_manager=name)
        except exceptions.NotFound:
            continue
        except exceptions.GoogleAPICallError as err:
            raise CleanupError(f"cannot list group {name} in {zone}: {err.message}") from None
        path = f"projects/{project}/zones/{zone}/instanceGroupManagers/{name}"
        found.append(Owned(GROUP, path, f"{group.target_size} VMs"))
    return found


def remove_groups(client, project: str, zones: Iterable[str], name: str, *,
                  skip_zone: str | None = None, timeout_s: float = DELETE_TIMEOUT_S) -> Removal:  # fmt: skip
    """Delete the group `name` in each of `zones` but `skip_zone`; return once none is left
    there. CleanupError on a refusal or after `timeout_s`, naming what is still there."""
    from google.api_core import exceptions

    where = [z for z in dict.fromkeys(zones) if z != skip_zone]
    deadline = time.monotonic() + timeout_s
    deleted = []
    for owned in list_groups(client, project, where, name):
        try:
            client.delete(project=project, zone=owned.zone, instance_group_manager=name)
        except exceptions.NotFound:
            continue
        except exceptions.GoogleAPICallError as err:
            raise CleanupError(f"cannot delete {owned.line()}: {err.message}") from None
        deleted.append(owned)
    while left := list_groups(client, project, where, name):
        if time.monotonic() > deadline:
            raise CleanupError(f"still there after {timeout_s:.0f} s: "
                               + "; ".join(o.line() for o in left))  # fmt: skip
        time.sleep(POLL_INITIAL_S)
    return Removal(tuple(deleted), where="Compute Engine (outside Pulumi's state)")


def google_client():
    """An InstanceGroupManagersClient on Google's endpoint with Application Default Credentials."""
    from google.cloud import compute_v1

    return compute_v1.InstanceGroupManagersClient(transport="rest")
