"""A managed instance group's VMs, read as one slice state (contract.node_state), the one
table recovery judges by on both paths. A slice is all or nothing: one VM stopped ends it."""

from __future__ import annotations

from contract.node_state import SliceState

DOWN = {"TERMINATED", "STOPPED", "STOPPING", "SUSPENDED", "SUSPENDING"}
COMING = {"PROVISIONING", "STAGING", "PENDING", "REPAIRING"}
MAKING = {"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING", "VERIFYING", "STARTING",
          "RESUMING", "REFRESHING", "RESTARTING"}  # fmt: skip
UNMAKING = {"DELETING", "ABANDONING", "STOPPING", "SUSPENDING"}


def slice_state(target_size: int, managed: list, spot: bool = True) -> tuple[SliceState, str]:
    """(state, detail) of a group of `target_size` whose managed instances are `managed`
    (google.cloud.compute_v1.ManagedInstance)."""
    actions = [str(m.current_action or "NONE") for m in managed]
    statuses = [str(m.instance_status or "") for m in managed]
    refused = [e for m in managed for e in m.last_attempt.errors.errors]
    if refused:
        return SliceState.CREATING, f"VMs not made: {refused[0].code}: {refused[0].message}"
    if any(a in UNMAKING for a in actions):
        return SliceState.DELETING, "VMs being deleted"
    down = [m.name or m.instance.rsplit("/", 1)[-1] for m, s in zip(managed, statuses, strict=True)
            if s in DOWN]  # fmt: skip
    if down:
        state = SliceState.PREEMPTED if spot else SliceState.TERMINATED
        return state, f"VM {', '.join(down)} {statuses[0] if len(set(statuses)) == 1 else 'down'}"
    if not target_size:
        return SliceState.STOPPED, "the group's target size is 0"
    if any(a in MAKING for a in actions) or any(s in COMING for s in statuses):
        return SliceState.CREATING, f"VMs {', '.join(sorted(set(statuses) - {''})) or 'coming'}"
    if len(managed) < target_size:
        return SliceState.CREATING, f"{len(managed)} of {target_size} VMs"
    if all(s == "RUNNING" for s in statuses):
        return SliceState.READY, ""
    return SliceState.UNRECOGNIZED, f"VM states {', '.join(sorted(set(statuses)))}"
