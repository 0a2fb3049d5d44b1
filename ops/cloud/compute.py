"""The Compute Engine provider: a slice that is a managed instance group (MIG) with a workload
policy, through Google's client (google-cloud-compute, REST), behind the same seam as the TPU
API's (`ops.cloud.tpu.TpuProvider`) and driven by the same recovery table.

The slice is the group: describe reads it and its managed instances (`listManagedInstances`,
then each VM's address and its SSH host key from guest attributes `hostkeys/`); recreate is
delete + insert of the group from the spec the Pulumi program exported (`infra.mig_spec`:
template and workload policy stay, as `pulumi up` made them), in one of tpupod:zones; a group is
all or nothing (BULK), so a VM preempted (TERMINATED) is the slice's preemption. The attempt a new
group boots reaches its VMs as group-wide metadata (`allInstancesConfig`), as a template cannot
change. A create is done when its VMs exist or were refused: Compute Engine reports a stockout
on the managed instances (`lastAttempt.errors`), not on the insert's operation.
"""

from __future__ import annotations

import ipaddress
import json
import time

from google.api_core import exceptions as gexc
from google.auth.exceptions import TransportError
from google.cloud import compute_v1

from contract import metadata
from ops.cloud import queued
from ops.cloud.compute_errors import RETRIED_REASONS, reason_of, rpc_code
from ops.cloud.compute_state import MAKING, slice_state
from ops.cloud.credentials import credentials
from ops.cloud.slice import ProviderError, SliceInfo, SliceState, Worker, ZoneCursor
from ops.cloud.target import Target
from ops.cloud.tpu import CALL_TIMEOUT, OperationStatus
from ops.cloud.tpu_errors import Refused, failure_kind, one_line


class ComputeProvider(ZoneCursor):
    """One group of one target, in one zone of its tpupod:zones at a time (`zone`)."""

    queued = False  # queued resources exist only on the TPU API

    def __init__(self, target: Target, clients: dict | None = None):
        self.target = target
        self.name = target.stack
        self.capacity = target.capacity
        self.zones: list[str] = self.capacity["zones"]
        self.zone = target.zone
        self._clients = clients
        self._outcomes: dict[str, OperationStatus] = {}  # refused creates, by operation
        self._known: dict[tuple, tuple[str, str]] = {}  # (zone, VM, id) -> (address, host key)

    @property
    def clients(self) -> dict:
        if self._clients is None:
            self._clients = make_clients(self.target)
        return self._clients

    @property
    def group(self) -> str:
        return self.target.node

    # -- reads -----------------------------------------------------------------------------------
    def describe(self) -> SliceInfo:
        found = self._managed()
        if found is None and len(self.zones) > 1:
            found = self._locate()
        if found is None:
            return SliceInfo(SliceState.MISSING, detail="group not found", zone=self.zone)
        manager, managed = found
        scheduling = self.target.spec.get("template", {}).get("properties", {}).get(
            "scheduling", {})  # fmt: skip
        spot = scheduling.get("provisioningModel") == "SPOT"
        state, detail = slice_state(manager.target_size, managed, spot)
        workers = self.workers(managed) if state is SliceState.READY else []
        if state is SliceState.READY and len(workers) < len(managed):
            state, detail, workers = SliceState.CREATING, "a VM of the group is changing", []
        health = "HEALTHY" if state is SliceState.READY else None
        return SliceInfo(state, health, workers, detail or None, self.target.metadata, spot,
                         self.zone)  # fmt: skip

    def _managed(self):
        """(the group, its managed instances) here; None when there is no group here."""
        groups = self.clients["groups"]
        try:
            manager = self._call("get", groups.get, project=self.target.project, zone=self.zone,
                                 instance_group_manager=self.group)  # fmt: skip
            listed = self._call("listManagedInstances", groups.list_managed_instances,
                                project=self.target.project, zone=self.zone,
                                instance_group_manager=self.group)  # fmt: skip
        except gexc.NotFound:
            return None
        return manager, list(listed)

    def _locate(self):
        """The group in another of tpupod:zones (a watch restarted after a move): there it is
        from now on; the zone stays as it was when there is none (or a call fails)."""
        here, found = self.zone, None
        try:
            for zone in self.zones:
                if zone != here:
                    self.zone = zone
                    if (found := self._managed()) is not None:
                        return found
            return None
        finally:
            if found is None:
                self.zone = here

    def workers(self, managed: list) -> list[Worker]:
        """Each VM's internal address and host key (read once per VM: by zone, name and id, so
        a new VM of a name is read afresh); worker i is the i-th address in order."""
        rows, seen = [], {}
        for entry in managed:
            name = entry.instance.rsplit("/", 1)[-1]
            key = (self.zone, name, entry.id) if entry.id else None
            row = self._known.get(key) if key else None
            if row is None:
                try:
                    vm = self._call("instances.get", self.clients["instances"].get,
                                    project=self.target.project, zone=self.zone, instance=name)  # fmt: skip
                except gexc.NotFound:  # deleted since the group listed it: the slice is changing
                    continue
                ip = vm.network_interfaces[0].network_i_p if vm.network_interfaces else ""
                row = (ip, self._host_key(name))
            if key and row[1] is not None:
                seen[key] = row
            rows.append((name, *row))
        self._known = seen
        rows.sort(key=lambda r: (not r[1], ipaddress.ip_address(r[1] or "0.0.0.0")))
        return [self._worker(i, name, ip, key) for i, (name, ip, key) in enumerate(rows)]

    def _host_key(self, instance: str) -> str | None:
        """The VM's ed25519 host key from its guest attributes; None while it has not written
        it (or they are off: SSH to it is then refused, the key being pinned)."""
        t = self.target
        try:
            attrs = self._call("getGuestAttributes", self.clients["instances"].get_guest_attributes,
                               request={"project": t.project, "zone": self.zone,
                                        "instance": instance, "query_path": "hostkeys/"})  # fmt: skip
        except (gexc.NotFound, Refused):
            return None
        return next((i.value for i in attrs.query_value.items if i.key == "ssh-ed25519"), None)

    def _worker(self, index: int, instance: str, ip: str, host_key: str | None) -> Worker:
        t, ssh = self.target, self.target.ssh
        common = dict(user=ssh.user, key_filename=ssh.key_file, instance=instance,
                      host_key=host_key, internal_ip=ip)  # fmt: skip
        if ssh.via == "internal":
            return Worker(index, ip, ssh.ports.get(ip, 22), **common)
        proxy = ssh.iap_command.format(instance=instance, zone=self.zone, project=t.project)
        return Worker(index, instance, 22, proxy_command=proxy, **common)

    def refresh_spec(self) -> list[str]:
        """The group's template stays what the spec names (`pulumi up` replaces the template
        and the group together): nothing to refresh from the live group."""
        return []

    def operation(self, name: str) -> OperationStatus:
        """`name`: zones/Z/operations/O. A group's insert is done when its VMs exist or were
        refused: Compute Engine marks the insert DONE before it tries any VM, and reports a
        stockout on the managed instances (`lastAttempt.errors`), later."""
        if name in self._outcomes:  # a refusal read once (its group is withdrawn since)
            return self._outcomes[name]
        parts = name.split("/")
        if len(parts) != 4 or parts[0] != "zones" or parts[2] != "operations":
            raise ProviderError(f"operation {name!r} is not a Compute Engine zone operation "
                                "(zones/Z/operations/O): a journal from another path?")  # fmt: skip
        zone, op_name = parts[1], parts[3]
        try:
            op = self._call("zoneOperations.get", self.clients["operations"].get,
                            project=self.target.project, zone=zone, operation=op_name)  # fmt: skip
        except gexc.NotFound:
            return OperationStatus(name, True)
        if op.status != compute_v1.Operation.Status.DONE:
            return OperationStatus(name, False)
        if op.error and op.error.errors:
            first = op.error.errors[0]
            return OperationStatus(
                name, True, rpc_code(first.code), f"{first.code}: {first.message}"
            )
        if not op.operation_type.endswith("insert"):  # compute.instanceGroupManagers.insert
            return OperationStatus(name, True)
        return self._vms_made(name, zone)

    def _vms_made(self, name: str, zone: str) -> OperationStatus:
        self.zone, asked = zone, self.zone
        try:
            found = self._managed()
            if found is None:
                return OperationStatus(name, True)  # gone: the node state says the rest
            manager, managed = found
            errors = [e for m in managed for e in m.last_attempt.errors.errors]
            if not errors:
                making = [m for m in managed if str(m.current_action or "NONE") in MAKING]
                return OperationStatus(name, len(managed) >= manager.target_size and not making)
            code, message = rpc_code(errors[0].code), f"{errors[0].code}: {errors[0].message}"
            kind = failure_kind(code, message)  # stockout, quota (the zone's or the region's)
            outcome = OperationStatus(name, True, code, message,
                                      refusal="" if kind == "other" else kind)  # fmt: skip
            self._outcomes[name] = outcome
            # A refused group would go on asking for VMs (and fill, and bill, later): withdrawn
            # here, as a failed TPU create leaves nothing; the next create goes where recovery says.
            self.start_delete()
            return outcome
        finally:
            self.zone = asked

    def request_status(self, zone: str | None = None) -> queued.QueuedStatus:
        return queued.QueuedStatus(queued.MISSING)

    def abandon_request(self, zone: str | None = None) -> bool:
        return True

    # -- writes ----------------------------------------------------------------------------------
    def start_delete(self) -> str | None:
        """instanceGroupManagers.delete (its VMs with it); None when there is no group here."""
        try:
            op = self._call("delete", self.clients["groups"].delete, project=self.target.project,
                            zone=self.zone, instance_group_manager=self.group)  # fmt: skip
        except gexc.NotFound:
            return None
        return f"zones/{self.zone}/operations/{op.name}"

    def start_create(self, attempt: int | None = None) -> str | None:
        """instanceGroupManagers.insert from the spec, here; None when the group exists."""
        body = dict(self.target.spec["manager"])
        if attempt is not None:
            body["allInstancesConfig"] = {"properties": {"metadata": {
                metadata.ATTEMPT: str(attempt)}}}  # fmt: skip
        try:
            op = self._call("insert", self.clients["groups"].insert, project=self.target.project,
                            zone=self.zone,
                            instance_group_manager_resource=group_body(body))  # fmt: skip
        except gexc.Conflict:
            return None
        return f"zones/{self.zone}/operations/{op.name}"

    def recreate(self, timeout: float = 600.0, poll: float = 0.5) -> OperationStatus:
        """Blocking delete + create, until the VMs run (for the CLI and tests)."""
        end = time.time() + timeout

        def wait(name: str | None) -> OperationStatus:
            while name and not (status := self.operation(name)).done:
                if time.time() > end:
                    raise ProviderError(f"{name} of {self.name} still running after {timeout:.0f}s")
                time.sleep(poll)
            return status if name else OperationStatus("", True)

        wait(self.start_delete())
        status = wait(self.start_create())
        while not status.error_code and self.describe().state is not SliceState.READY:
            if time.time() > end:
                raise ProviderError(f"group {self.group} not READY after {timeout:.0f}s")
            time.sleep(poll)
        return status

    def owned(self) -> list:
        """The slice's group in each of tpupod:zones (recovery may have moved it): what the
        group's before_delete hook removes at `pulumi destroy` (infra.group_cleanup)."""
        from infra import group_cleanup

        return group_cleanup.list_groups(self.clients["groups"], self.target.project, self.zones,
                                         self.group)  # fmt: skip

    def _call(self, what: str, method, **kwargs):
        try:
            return method(**kwargs, timeout=CALL_TIMEOUT)
        except (gexc.NotFound, gexc.Conflict):
            raise
        except gexc.GoogleAPICallError as err:
            where = f"projects/{self.target.project}/zones/{self.zone}/instanceGroupManagers/"
            line = f"Compute Engine {what} {where}{self.group}: {one_line(err)}"
            final = isinstance(err, (gexc.Forbidden, gexc.BadRequest, gexc.Unauthorized))
            if final and reason_of(err) not in RETRIED_REASONS:
                raise Refused(line) from None  # recovery stops with what to fix
            raise ProviderError(line) from None
        except (OSError, TransportError) as err:  # no answer: the next poll asks again
            raise ProviderError(f"Compute Engine {what}: {str(err).splitlines()[0][:200]}"
                                ) from None  # fmt: skip


def group_body(body: dict) -> compute_v1.InstanceGroupManager:
    """The spec's group (Compute Engine v1's JSON, as infra.mig_spec writes it) as the client's
    type; a field the installed client does not know is one clear line."""
    try:
        return compute_v1.InstanceGroupManager.from_json(json.dumps(body))
    except (ValueError, TypeError) as err:
        raise ProviderError(f"the spec's group is not a compute_v1.InstanceGroupManager: {err}"
                            ) from None  # fmt: skip


def make_clients(target: Target) -> dict:
    creds = credentials(target.token_file)
    options = {"api_endpoint": target.compute_endpoint} if target.compute_endpoint else None

    def make(cls):
        return cls(transport="rest", credentials=creds, client_options=options)

    return {"groups": make(compute_v1.InstanceGroupManagersClient),
            "instances": make(compute_v1.InstancesClient),
            "operations": make(compute_v1.ZoneOperationsClient)}  # fmt: skip
