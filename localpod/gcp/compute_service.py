"""The subset of Compute Engine v1 a TPU slice made through a managed instance group uses, backed by
the pod's one `Slice`: instance templates, regional resource policies (a workload policy naming
the accelerator topology), one zonal MIG whose instances are the pod's workers, and the
operations they return. `localpod.gcp.compute_api` serves it over HTTP.

Semantics kept as Google's (what the path relies on):
- A MIG insert is DONE once the group exists; its VMs come after (managed instances CREATING,
  then NONE; instances PROVISIONING, then RUNNING). All or nothing (BULK): a stockout leaves every
  VM CREATING with `lastAttempt.errors` naming ZONE_RESOURCE_POOL_EXHAUSTED, and no VM at all.
- The slice is the pod's: the template's machine type must be one Compute Engine makes TPUs on
  (infra.catalog), the workload policy's topology that type's shape for the pod's host count,
  and `targetSize` the pod's workers. A spot VM preempted (or stopped for maintenance) stays in
  the group TERMINATED (instanceTerminationAction STOP); DO_NOTHING: the group does not repair it.
- VM names are `baseInstanceName-xxxx`; recreateInstances keeps them, a new group makes new ones.
"""

from __future__ import annotations

import hashlib
import secrets
import string
import threading
import time

from contract import metadata
from infra import catalog
from localpod.gcp.compute_errors import ComputeError, already_exists, invalid, not_found
from localpod.gcp.compute_kept import REGION, KeptResources, op_path
from localpod.gcp.compute_operations import resource_id, timestamp
from localpod.gcp.tpu_faults import TpuFaults
from localpod.state import PodError, SliceState
from localpod.vm.slice import Slice

STOCKOUT_CODE = "ZONE_RESOURCE_POOL_EXHAUSTED"
STOCKOUT = ("The zone '{zone}' does not have enough resources available to fulfill the request. "
            "Try a different zone, or try again later.")  # fmt: skip
# The slice's state -> (instance status, managed instance currentAction).
INSTANCE_STATUS = {
    SliceState.CREATING: ("PROVISIONING", "CREATING"),
    SliceState.READY: ("RUNNING", "NONE"),
    SliceState.PREEMPTED: ("TERMINATED", "NONE"),
    SliceState.TERMINATED: ("TERMINATED", "NONE"),
    SliceState.DELETING: ("STOPPING", "DELETING"),
}
# Compute Engine's wording of a quota refusal ("Quota 'CPUS' exceeded.  Limit: 24.0 in region R.")
QUOTA = "Quota '{metric}' exceeded.  Limit: 0.0 in {where}."
STOCKOUT_DELAY_S = 0.2  # the VMs' lastAttempt says so a moment after the insert is DONE
DELETE_WAIT_S = 120.0  # a delete waits this long for the slice's running operation
MIG_OPS = "compute.instanceGroupManagers."  # how Compute Engine names a group's operations
MACHINE_TYPES = {g.compute.machine_type: g for g in catalog.GENERATIONS.values() if g.compute}


def _suffix() -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(4))


class ComputeService(KeptResources):
    """At most one MIG (the pod has one slice), any number of templates and policies."""

    def __init__(self, slice_: Slice, layout: dict, faults: TpuFaults) -> None:
        super().__init__()
        self.slice, self.layout, self.faults = slice_, layout, faults
        self.hosts = len(layout["addresses"])
        self.manager: dict | None = None  # {"path", "zone", "body", "names", "refused", ...}

    # -- the group -------------------------------------------------------------------------------
    def insert_manager(self, project: str, zone: str, body: dict) -> dict:
        scope = self.scope(project, zone=zone)
        name = self.check_name(body.get("name"), "resource.name")
        base = self.check_name(body.get("baseInstanceName") or name, "resource.baseInstanceName")
        path = f"{scope}/instanceGroupManagers/{name}"
        template_path = self.ref(body.get("instanceTemplate"), "resource.instanceTemplate",
                                 "instanceTemplates")  # fmt: skip
        policy_ref = (body.get("resourcePolicies") or {}).get("workloadPolicy")
        with self._lock:
            if self.manager is not None and self.manager["path"] == path:
                raise already_exists(path)
            template = self.get_kept(self.templates, template_path)
            policy_path = None
            if policy_ref:
                policy_path = self.ref(policy_ref, "resource.resourcePolicies.workloadPolicy",
                                       "resourcePolicies")  # fmt: skip
                self.get_kept(self.policies, policy_path)
            self._check_shape(template, policy_path, body.get("targetSize"))
            if self.manager is not None or self.slice.state != SliceState.MISSING:
                raise ComputeError(400, "resourceNotReady", f"The local pod's {self.hosts} "
                                   "workers are in use by another slice: delete it first")  # fmt: skip
            self.manager = {"path": path, "zone": zone, "template": template_path,
                            "policy": policy_path, "names": [f"{base}-{_suffix()}" for _ in
                                                             range(self.hosts)],
                            "refused": None, "id": resource_id(), "created": timestamp(),
                            "body": dict(body)}  # fmt: skip
            try:
                self._boot(zone)
            except ComputeError:
                self.manager = None  # no group where no VM could even be asked for
                raise
        return self._done(scope, MIG_OPS + "insert", path)

    def _check_shape(self, template: dict, policy_path: str | None, size: object) -> None:
        machine = str(template["properties"]["machineType"]).rsplit("/", 1)[-1]
        generation = MACHINE_TYPES.get(machine)
        if generation is None:
            raise invalid(f"Invalid value for field 'resource.instanceTemplate': the machine type "
                          f"'{machine}' of the template is not a TPU machine type the local pod "
                          f"plays (one of {', '.join(sorted(MACHINE_TYPES))})")  # fmt: skip
        if size != self.hosts:
            raise invalid(f"Invalid value for field 'resource.targetSize': '{size}'. The local "
                          f"pod's slice has {self.hosts} hosts.")  # fmt: skip
        if policy_path is None:
            return
        topology = self.policies[policy_path].get("workloadPolicy", {}).get("acceleratorTopology")
        chips = catalog.MULTI_HOST_CHIPS_PER_HOST * self.hosts
        if topology and topology != generation.compute.topologies.get(chips):
            raise invalid(f"Invalid value for field 'resource.resourcePolicies.workloadPolicy': "
                          f"topology '{topology}' is not {self.hosts} {machine} VMs "
                          f"({generation.compute.topologies.get(chips, 'not offered')})")  # fmt: skip

    def _boot(self, zone: str) -> None:
        """The VMs of the group, all at once (BULK), or none with a stockout's error."""
        mig = self.manager
        refusal = None
        if self.faults.take_stockout(zone):  # told on the VMs a moment after the insert is DONE
            refusal = {"code": STOCKOUT_CODE, "message": STOCKOUT.format(zone=zone)}
        elif scope := self.faults.take_quota(zone):
            where = f"region {REGION}" if scope == "region" else f"zone {zone}"
            refusal = {"code": "QUOTA_EXCEEDED",
                       "message": QUOTA.format(metric=self._quota_metric(), where=where)}  # fmt: skip
        if refusal is not None:
            mig["refused"], mig["refused_at"] = refusal, time.monotonic() + STOCKOUT_DELAY_S
            return
        template = self.templates[mig["template"]]
        meta = {i["key"]: i.get("value", "") for i in
                (template["properties"].get("metadata") or {}).get("items") or []}  # fmt: skip
        meta |= ((mig["body"].get("allInstancesConfig") or {}).get("properties") or {}).get(
            "metadata") or {}  # fmt: skip
        self.slice.store.set_node(node_id=mig["path"].rsplit("/", 1)[1], zone=zone,
                                  preemptible=_spot(template), **_account(template))  # fmt: skip
        try:
            self.slice.create(meta, hostnames=list(mig["names"]), worker_key=metadata.WORKER_ID)
        except PodError as err:
            raise ComputeError(400, "resourceNotReady", str(err)) from None

    def _quota_metric(self) -> str:
        """The pod's own name for the chips' quota (Compute Engine's TPU metric names are not
        in Google's reference we hold): the generation's, as TPU7X_CHIPS."""
        machine = str(self.templates[self.manager["template"]]["properties"]["machineType"])
        return f"{MACHINE_TYPES[machine.rsplit('/', 1)[-1]].name.upper()}_CHIPS"

    def delete_manager(self, project: str, zone: str, name: str) -> dict:
        """The group and its VMs; a group still making its VMs is deleted once they are made
        (Google takes the delete at once; the operation ends when the VMs are gone)."""
        path = f"{self.scope(project, zone=zone)}/instanceGroupManagers/{name}"
        with self._lock:
            mig = self._mig(path)
            op = self.ops.new(path.rsplit("/", 2)[0], MIG_OPS + "delete", path)
        threading.Thread(target=self._delete_when_idle, args=(mig, op), daemon=True).start()
        return self.ops.get(op_path(op))

    def _delete_when_idle(self, mig: dict, op: dict) -> None:
        def gone() -> None:
            with self._lock:
                if self.manager is mig:
                    self.manager = None
            self.ops.finish(op)

        deadline = time.monotonic() + DELETE_WAIT_S
        while time.monotonic() < deadline:
            with self._lock:
                state = self.slice.state
                if state == SliceState.MISSING:
                    return gone()
                if state in (SliceState.READY, SliceState.PREEMPTED, SliceState.TERMINATED):
                    try:
                        self.slice.delete(on_done=gone)
                        return None
                    except PodError:  # another operation began meanwhile: wait for it
                        pass
            time.sleep(0.1)
        self.ops.finish(op, (503, "TIMEOUT", f"the slice stayed {self.slice.state}"))
        return None

    def _mig(self, path: str) -> dict:
        mig = self.manager
        if mig is None or mig["path"] != path:
            raise not_found(path)
        return mig

    def resize(self, project: str, zone: str, name: str, size: int) -> dict:
        """0 deletes every VM, the pod's host count makes them again (new names); a slice cannot
        be any other size."""
        path = f"{self.scope(project, zone=zone)}/instanceGroupManagers/{name}"
        with self._lock:
            mig = self._mig(path)
            if size not in (0, self.hosts):
                raise invalid(f"Invalid value for field 'size': '{size}'. The slice's group "
                              f"is all or nothing: 0 or {self.hosts}.")  # fmt: skip
            mig["body"]["targetSize"] = size
            try:
                if size == 0 and self.slice.state != SliceState.MISSING:
                    self.slice.delete()
                elif size and self.slice.state == SliceState.MISSING:
                    mig["names"] = [f"{mig['body'].get('baseInstanceName') or name}-{_suffix()}"
                                    for _ in range(self.hosts)]  # fmt: skip
                    mig["refused"] = None
                    self._boot(zone)
            except PodError as err:
                raise ComputeError(400, "resourceNotReady", str(err)) from None
        return self._done(path.rsplit("/", 2)[0], "compute.instanceGroupManagers.resize", path)

    def recreate_instances(self, project: str, zone: str, name: str, body: dict) -> dict:
        """Every VM of the slice, deleted and made again under its name (one VM alone cannot be:
        a slice heals as a unit)."""
        path = f"{self.scope(project, zone=zone)}/instanceGroupManagers/{name}"
        with self._lock:
            mig = self._mig(path)
            named = {str(u).rsplit("/", 1)[-1] for u in body.get("instances") or []}
            if named != set(mig["names"]):
                raise invalid("Invalid value for field 'resource.instances': a slice's VMs are "
                              f"recreated together: name all of {', '.join(mig['names'])}")  # fmt: skip

            def again() -> None:
                with self._lock:
                    if self.manager is mig:
                        mig["refused"] = None
                        try:
                            self._boot(zone)
                        except ComputeError as err:  # on the slice's thread: one line, no raise
                            print(f"recreateInstances of {mig['path']}: {err.message}",
                                  flush=True)  # fmt: skip

            try:
                if self.slice.state == SliceState.MISSING:
                    again()
                else:
                    self.slice.delete(on_done=again)
            except PodError as err:
                raise ComputeError(400, "resourceNotReady", str(err)) from None
        return self._done(path.rsplit("/", 2)[0], "compute.instanceGroupManagers.recreateInstances",
                          path)  # fmt: skip

    def get_manager(self, project: str, zone: str, name: str) -> dict:
        path = f"{self.scope(project, zone=zone)}/instanceGroupManagers/{name}"
        with self._lock:
            return self._manager_json(self._mig(path))

    def list_managers(self, project: str, zone: str) -> dict:
        scope = self.scope(project, zone=zone)
        with self._lock:
            mig = self.manager
            items = [self._manager_json(mig)] if mig and mig["zone"] == zone else []
        return {"kind": "compute#instanceGroupManagerList", "items": items,
                "selfLink": self.link(f"{scope}/instanceGroupManagers")}  # fmt: skip

    def _manager_json(self, mig: dict) -> dict:
        actions = [m["currentAction"] for m in self._managed(mig)]
        counts = {a.lower(): actions.count(a) for a in ("CREATING", "DELETING", "NONE",
                                                       "RECREATING")}  # fmt: skip
        scope = mig["path"].rsplit("/", 2)[0]
        return {
            **mig["body"],
            "kind": "compute#instanceGroupManager",
            "id": mig["id"],
            "creationTimestamp": mig["created"],
            "zone": self.link(scope),
            "selfLink": self.link(mig["path"]),
            "instanceGroup": self.link(f"{scope}/instanceGroups/{mig['path'].rsplit('/', 1)[1]}"),
            "instanceTemplate": self.link(mig["template"]),
            "currentActions": counts,
            "status": {"isStable": counts["none"] == len(actions)},
        } | ({"resourcePolicies": {"workloadPolicy": self.link(mig["policy"])}}
             if mig["policy"] else {})  # fmt: skip

    def _managed(self, mig: dict) -> list[dict]:
        scope = mig["path"].rsplit("/", 2)[0]
        view = self.slice.describe()
        state, found = SliceState(view["state"]), view["instances"]
        out = []
        for i, name in enumerate(mig["names"]):
            entry = {"instance": self.link(f"{scope}/instances/{name}"), "name": name}
            if mig["refused"] is not None:
                entry["currentAction"] = "CREATING"
                if time.monotonic() >= mig.get("refused_at", 0):
                    entry["lastAttempt"] = {"errors": {"errors": [dict(mig["refused"])]}}
            elif state in INSTANCE_STATUS:
                status, action = INSTANCE_STATUS[state]
                vm = found[i] if i < len(found) else {}
                entry.update(currentAction=action, instanceStatus=status, id=vm_id(name, vm))
            else:
                entry["currentAction"] = "CREATING"
            out.append(entry)
        return out

    def list_managed(self, project: str, zone: str, name: str) -> dict:
        path = f"{self.scope(project, zone=zone)}/instanceGroupManagers/{name}"
        with self._lock:
            return {"managedInstances": self._managed(self._mig(path))}

    # -- instances -------------------------------------------------------------------------------
    def instance_rows(self, project: str, zone: str) -> list[tuple[int, str, dict]]:
        """(worker index, name, the slice's instance record) of each VM that exists here."""
        self.scope(project, zone=zone)
        with self._lock:
            mig = self.manager
            if mig is None or mig["zone"] != zone or mig["refused"] is not None:
                return []
            view = self.slice.describe()
            if SliceState(view["state"]) not in INSTANCE_STATUS:
                return []
            found = view["instances"]
            return [(i, n, found[i] if i < len(found) else {}) for i, n in enumerate(mig["names"])]

    def instance_status(self) -> str:
        return INSTANCE_STATUS.get(SliceState(self.slice.describe()["state"]), ("TERMINATED",))[0]

    def template_of_manager(self) -> dict:
        with self._lock:
            return dict(self.templates.get(self.manager["template"], {})) if self.manager else {}


def vm_id(name: str, vm: dict) -> str:
    """A VM's id, as instances.get and listManagedInstances both give it: the same while the VM
    is, a new one when the slice under the name is made again (a new host key)."""
    return str(int(hashlib.sha256(f"{name}\n{vm.get('host_key')}".encode()).hexdigest()[:15], 16))


def _spot(template: dict) -> bool:
    scheduling = template["properties"].get("scheduling") or {}
    return scheduling.get("provisioningModel") == "SPOT" or bool(scheduling.get("preemptible"))


def _account(template: dict) -> dict:
    accounts = template["properties"].get("serviceAccounts") or []
    if not accounts:
        return {}
    return {"service_account": accounts[0].get("email"),
            "scopes": list(accounts[0].get("scopes") or [])}  # fmt: skip
