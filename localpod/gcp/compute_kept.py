"""Compute Engine v1's instance templates and regional resource policies, as the pod's Compute
Engine API keeps them (the group that uses them: localpod.gcp.compute_service), with the names,
references and scopes (projects/P/global, /regions/R, /zones/Z) every resource of it shares."""

from __future__ import annotations

import re
import threading

from localpod.gcp.compute_errors import ComputeError, already_exists, invalid, not_found
from localpod.gcp.compute_operations import ComputeOperations, resource_id, timestamp
from localpod.vm.metadata_server import PROJECT_ID, PROJECT_NUMBER, ZONES

REGION = ZONES[0].rsplit("-", 1)[0]
NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
TOPOLOGY = re.compile(r"\d+(x\d+){1,2}")


class KeptResources:
    """Templates and policies by path; `manager` is the group using some (ComputeService's)."""

    def __init__(self) -> None:
        self.root = ""  # the API root selfLinks start with (…/compute/v1/): the server sets it
        self.ops = ComputeOperations(self.link)
        self.templates: dict[str, dict] = {}
        self.policies: dict[str, dict] = {}
        self.manager: dict | None = None
        self._lock = threading.RLock()

    def link(self, path: str) -> str:
        return f"{self.root}{path}"

    def scope(self, project: str, zone: str | None = None, region: str | None = None) -> str:
        if project not in (PROJECT_ID, PROJECT_NUMBER):
            raise not_found(f"projects/{project}")
        if zone is not None and zone not in ZONES:
            raise not_found(f"projects/{project}/zones/{zone}")
        if region is not None and region != REGION:
            raise not_found(f"projects/{project}/regions/{region}")
        where = f"zones/{zone}" if zone else f"regions/{region}" if region else "global"
        return f"projects/{PROJECT_ID}/{where}"

    def ref(self, value: object, field: str, kind: str) -> str:
        """A reference as Compute Engine takes one (a full URL, projects/..., or the partial
        global/... or regions/R/...), as the resource's path; 400 naming `field` otherwise."""
        text = str(value or "")
        if "/projects/" in text:
            text = "projects/" + text.split("/projects/", 1)[1]
        elif text and not text.startswith("projects/"):
            text = f"projects/{PROJECT_ID}/{text}"
        if f"/{kind}/" not in text:
            raise invalid(f"Invalid value for field '{field}': '{value}'. Must be a URL to a "
                          f"{kind[:-1]}.")  # fmt: skip
        return text.replace(f"projects/{PROJECT_NUMBER}/", f"projects/{PROJECT_ID}/")

    @staticmethod
    def check_name(name: object, field: str) -> str:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise invalid(f"Invalid value for field '{field}': '{name}'. Must be a match of "
                          "regex '[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?'")  # fmt: skip
        return name

    # -- templates and policies -----------------------------------------------------------------
    def insert_template(self, project: str, body: dict) -> dict:
        scope = self.scope(project)
        name = self.check_name(body.get("name"), "resource.name")
        props = body.get("properties")
        if not isinstance(props, dict) or not props.get("machineType"):
            raise invalid("Invalid value for field 'resource.properties.machineType': ''. "
                          "Machine type is required.")  # fmt: skip
        path = f"{scope}/instanceTemplates/{name}"
        with self._lock:
            if path in self.templates:
                raise already_exists(path)
            self.templates[path] = {**body, "kind": "compute#instanceTemplate", "id": resource_id(),
                                    "creationTimestamp": timestamp(), "selfLink": self.link(path)}  # fmt: skip
        return self._done(scope, "insert", path)

    def insert_policy(self, project: str, region: str, body: dict) -> dict:
        scope = self.scope(project, region=region)
        name = self.check_name(body.get("name"), "resource.name")
        policy = body.get("workloadPolicy") or {}
        if policy.get("type") not in ("HIGH_AVAILABILITY", "HIGH_THROUGHPUT"):
            raise invalid(f"Invalid value for field 'resource.workloadPolicy.type': "
                          f"'{policy.get('type')}'.")  # fmt: skip
        topology = policy.get("acceleratorTopology")
        if topology is not None and not TOPOLOGY.fullmatch(str(topology)):
            raise invalid(f"Invalid value for field 'resource.workloadPolicy."
                          f"acceleratorTopology': '{topology}'.")  # fmt: skip
        path = f"{scope}/resourcePolicies/{name}"
        with self._lock:
            if path in self.policies:
                raise already_exists(path)
            self.policies[path] = {**body, "kind": "compute#resourcePolicy", "id": resource_id(),
                                   "region": self.link(scope), "status": "READY",
                                   "creationTimestamp": timestamp(), "selfLink": self.link(path)}  # fmt: skip
        return self._done(scope, "insert", path)

    def get_kept(self, kept: dict, path: str) -> dict:
        with self._lock:
            if path not in kept:
                raise not_found(path)
            return dict(kept[path])

    def delete_kept(self, kept: dict, path: str) -> dict:
        with self._lock:
            if path not in kept:
                raise not_found(path)
            users = self.manager and path in (self.manager["template"], self.manager["policy"])
            if users:
                raise ComputeError(400, "resourceInUseByAnotherResource",
                                   f"The {path.split('/')[-2][:-1]} resource '{path}' is already "
                                   f"being used by '{self.manager['path']}'")  # fmt: skip
            del kept[path]
        return self._done(path.rsplit("/", 2)[0], "delete", path)

    def list_kept(self, kept: dict, scope: str, kind: str) -> dict:
        with self._lock:
            items = [dict(v) for k, v in kept.items() if k.startswith(scope + "/")]
        return {"kind": f"compute#{kind}List", "items": items, "selfLink": self.link(scope)}

    def _done(self, scope: str, kind: str, path: str) -> dict:
        op = self.ops.new(scope, kind, path)
        self.ops.finish(op)
        return self.ops.get(op_path(op))


def op_path(op: dict) -> str:
    return "projects/" + op["selfLink"].split("/projects/", 1)[1]
