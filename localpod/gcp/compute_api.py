"""The pod's Compute Engine v1 REST API on loopback: the paths, JSON and error envelope of
compute.googleapis.com for what a TPU slice through a managed instance group uses.

`url` is the root gcloud's `api_endpoint_overrides/compute` and google-cloud-compute's
`api_endpoint` take (both append `compute/v1/`). Resources and their semantics are
`localpod.gcp.compute_service.ComputeService`; every call is authorised first by the pod's gate,
with the catalog's permissions for the route's REST method (contract/iam_catalog.json), on the
resource Google checks them on, before anything about the resource is told.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from localpod.gcp import compute_errors
from localpod.gcp.authz import Denied, Target
from localpod.gcp.compute_errors import ComputeError, invalid, not_found
from localpod.gcp.compute_service import ComputeService, vm_id
from localpod.gcp.loopback import JsonApiHandler, LoopbackServer

SERVICE = "compute.googleapis.com"
GUEST_ATTRIBUTES = "enable-guest-attributes"  # instance metadata that turns guest attributes on
ACT_AS = "iam.serviceAccounts.actAs"  # to make a resource run as a service account
_P = r"/compute/v1/projects/(?P<project>[^/]+)"
_Z = _P + r"/zones/(?P<zone>[^/]+)"
_R = _P + r"/regions/(?P<region>[^/]+)"
_G = _P + r"/global"
_MIG = _Z + r"/instanceGroupManagers/(?P<name>[^/]+)"
_OP = r"/operations/(?P<op>[^/]+)"


@dataclass(frozen=True)
class Route:
    verb: str
    pattern: re.Pattern
    action: str
    method: str  # the REST method id, as the IAM catalog names it
    kind: str  # the resource type the permission is checked on


def _r(verb: str, pattern: str, action: str, method: str, kind: str) -> Route:
    return Route(verb, re.compile(pattern), action, f"compute.{method}", f"{SERVICE}/{kind}")


# (verb, path, ComputeService action, REST method, resource type)
# fmt: off
_TABLE = (
    ("GET", _Z + r"/instances", "list_instances",
     "instances.list", "Instance"),
    ("GET", _Z + r"/instances/(?P<name>[^/]+)", "get_instance",
     "instances.get", "Instance"),
    ("GET", _Z + r"/instances/(?P<name>[^/]+)/getGuestAttributes", "guest_attributes",
     "instances.getGuestAttributes", "Instance"),
    ("POST", _G + r"/instanceTemplates", "insert_template",
     "instanceTemplates.insert", "InstanceTemplate"),
    ("GET", _G + r"/instanceTemplates", "list_templates",
     "instanceTemplates.list", "InstanceTemplate"),
    ("GET", _G + r"/instanceTemplates/(?P<name>[^/]+)", "get_template",
     "instanceTemplates.get", "InstanceTemplate"),
    ("DELETE", _G + r"/instanceTemplates/(?P<name>[^/]+)", "delete_template",
     "instanceTemplates.delete", "InstanceTemplate"),
    ("POST", _R + r"/resourcePolicies", "insert_policy",
     "resourcePolicies.insert", "ResourcePolicy"),
    ("GET", _R + r"/resourcePolicies", "list_policys",
     "resourcePolicies.list", "ResourcePolicy"),
    ("GET", _R + r"/resourcePolicies/(?P<name>[^/]+)", "get_policy",
     "resourcePolicies.get", "ResourcePolicy"),
    ("DELETE", _R + r"/resourcePolicies/(?P<name>[^/]+)", "delete_policy",
     "resourcePolicies.delete", "ResourcePolicy"),
    ("POST", _Z + r"/instanceGroupManagers", "insert_manager",
     "instanceGroupManagers.insert", "InstanceGroupManager"),
    ("GET", _Z + r"/instanceGroupManagers", "list_managers",
     "instanceGroupManagers.list", "InstanceGroupManager"),
    ("GET", _MIG, "get_manager",
     "instanceGroupManagers.get", "InstanceGroupManager"),
    ("DELETE", _MIG, "delete_manager",
     "instanceGroupManagers.delete", "InstanceGroupManager"),
    ("POST", _MIG + r"/resize", "resize",
     "instanceGroupManagers.resize", "InstanceGroupManager"),
    ("POST", _MIG + r"/recreateInstances", "recreate_instances",
     "instanceGroupManagers.recreateInstances", "InstanceGroupManager"),
    ("POST", _MIG + r"/listManagedInstances", "list_managed",
     "instanceGroupManagers.listManagedInstances", "InstanceGroupManager"),
    ("GET", _Z + _OP, "get_op",
     "zoneOperations.get", "Operation"),
    ("POST", _Z + _OP + "/wait", "wait_op",
     "zoneOperations.wait", "Operation"),
    ("GET", _R + _OP, "get_op",
     "regionOperations.get", "Operation"),
    ("POST", _R + _OP + "/wait", "wait_op",
     "regionOperations.wait", "Operation"),
    ("GET", _G + _OP, "get_op",
     "globalOperations.get", "Operation"),
    ("POST", _G + _OP + "/wait", "wait_op",
     "globalOperations.wait", "Operation"),
)
# fmt: on
ROUTES = tuple(_r(*row) for row in _TABLE)


def instance_json(svc: ComputeService, scope: str, index: int, name: str, vm: dict) -> dict:
    """One VM of the group as instances.get answers: its template's properties (metadata with
    the group's allInstancesConfig over them), its own address, status and name."""
    props = svc.template_of_manager().get("properties") or {}
    path = f"{scope}/instances/{name}"
    nics = [{**nic, "name": f"nic{i}", "networkIP": svc.layout["addresses"][index]}
            for i, nic in enumerate(props.get("networkInterfaces") or [{}])]  # fmt: skip
    mig = svc.manager or {}
    meta = {i["key"]: i.get("value", "") for i in (props.get("metadata") or {}).get("items") or []}
    meta |= (((mig.get("body") or {}).get("allInstancesConfig") or {}).get("properties") or {}
             ).get("metadata") or {}  # fmt: skip
    items = [{"key": k, "value": v} for k, v in meta.items()]
    return {
        "kind": "compute#instance",
        "id": vm_id(name, vm),
        "name": name,
        "description": props.get("description", ""),
        "zone": svc.link(scope),
        "machineType": svc.link(f"{scope}/machineTypes/{props.get('machineType', '')}"),
        "status": svc.instance_status(),
        "networkInterfaces": nics,
        "metadata": {"kind": "compute#metadata", "items": items},
        "scheduling": props.get("scheduling") or {},
        "serviceAccounts": props.get("serviceAccounts") or [],
        "labels": props.get("labels") or {},
        "tags": props.get("tags") or {},
        "resourcePolicies": [svc.link(mig["policy"])] if mig.get("policy") else [],
        "creationTimestamp": mig.get("created", ""),
        "selfLink": svc.link(path),
    }


class _Handler(JsonApiHandler):
    server: ComputeApiServer
    service = SERVICE

    def _handle(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        raw = self.read_body()
        try:
            if self.server.faults.take_unavailable():
                raise ComputeError(503, "backendError", "The service is currently unavailable.")
            route, match = _find(self.command, url.path)
            args = match.groupdict()
            body = _json(raw) if route.verb == "POST" else {}
            self._authorize(route, url.path, args, body)
            result = self._act(route.action, args, query, body)
        except ComputeError as err:
            return self.reply_error(err)
        self.reply(200, result)

    def _act(self, action: str, args: dict, query: dict, body: dict) -> dict:
        svc: ComputeService = self.server.compute
        project, zone, region, name = (args.get(k) for k in ("project", "zone", "region", "name"))
        if action in ("get_op", "wait_op"):
            scope = svc.scope(project, zone=zone, region=region)
            path = f"{scope}/operations/{args['op']}"
            return svc.ops.wait(path) if action == "wait_op" else svc.ops.get(path)
        if action in ("list_instances", "get_instance", "guest_attributes"):
            return self._instances(svc, action, project, zone, name, query)
        kept = {"template": (svc.templates, svc.scope(project) if not region else "",
                             "instanceTemplates"),
                "policy": (svc.policies, svc.scope(project, region=region) if region else "",
                           "resourcePolicies")}  # fmt: skip
        for noun, (store, scope, kind) in kept.items():
            if action == f"insert_{noun}":
                return (svc.insert_template(project, body) if noun == "template"
                        else svc.insert_policy(project, region, body))  # fmt: skip
            if action in (f"get_{noun}", f"delete_{noun}"):
                path = f"{scope}/{kind}/{name}"
                return (svc.get_kept if action.startswith("get") else svc.delete_kept)(store, path)
            if action == f"list_{noun}s":  # list_templates, list_policys
                return svc.list_kept(store, scope, kind[:-1])
        if action == "insert_manager":
            return svc.insert_manager(project, zone, body)
        if action == "list_managers":
            return svc.list_managers(project, zone)
        if action == "resize":
            if not str(query.get("size", "")).isdigit():
                raise invalid("Invalid value for field 'size': a number is required.")
            return svc.resize(project, zone, name, int(query["size"]))
        if action == "recreate_instances":
            return svc.recreate_instances(project, zone, name, body)
        return getattr(svc, action)(project, zone, name)

    def _instances(self, svc, action, project, zone, name, query) -> dict:
        rows = svc.instance_rows(project, zone)
        scope = svc.scope(project, zone=zone)
        if action == "list_instances":
            items = [instance_json(svc, scope, i, n, vm) for i, n, vm in rows]
            return {"kind": "compute#instanceList", "items": items,
                    "selfLink": svc.link(f"{scope}/instances")}  # fmt: skip
        row = next((r for r in rows if r[1] == name), None)
        if row is None:
            raise not_found(f"{scope}/instances/{name}")
        if action == "get_instance":
            return instance_json(svc, scope, *row)
        props = svc.template_of_manager().get("properties") or {}
        meta = {i["key"]: i.get("value") for i in (props.get("metadata") or {}).get("items") or []}
        if str(meta.get(GUEST_ATTRIBUTES, "")).upper() != "TRUE":  # as GCE: off unless turned on
            raise not_found(f"{scope}/instances/{name}/guestAttributes")
        prefix = query.get("queryPath", "")
        items = [{"namespace": "hostkeys", "key": "ssh-ed25519", "value": row[2].get("host_key")}]
        items = [i for i in items if f"{i['namespace']}/{i['key']}".startswith(prefix)]
        if not items or svc.instance_status() != "RUNNING":
            raise not_found(f"{scope}/instances/{name}/guestAttributes/{prefix}")
        return {"kind": "compute#guestAttributes", "queryPath": prefix,
                "queryValue": {"items": items},
                "selfLink": svc.link(f"{scope}/instances/{name}/getGuestAttributes")}  # fmt: skip

    def _authorize(self, route: Route, path: str, args: dict, body: dict) -> None:
        """The route's permissions, each on the resource Google checks it on (the collection's
        parent for an insert or a list); actAs on a template's service account."""
        gate = self.server.gate
        if gate is None:
            return
        name = path.removeprefix("/compute/v1/").removesuffix("/wait")
        for tail in ("/getGuestAttributes", "/resize", "/recreateInstances",
                     "/listManagedInstances"):  # fmt: skip
            name = name.removesuffix(tail)
        if route.action.startswith(("insert_", "list_")) and route.action != "list_managed":
            name = name.rsplit("/", 1)[0]
        accounts = [a.get("email") for a in
                    ((body.get("properties") or {}).get("serviceAccounts") or [])
                    if isinstance(a, dict) and a.get("email")]  # fmt: skip
        where, cases = {}, ()
        if accounts and route.action == "insert_template":
            cases = ("service_account",)
            where[ACT_AS] = (
                f"projects/{args['project']}/serviceAccounts/{accounts[0]}",
                "iam.googleapis.com/ServiceAccount")  # fmt: skip
        targets: list[Target] = gate.targets(route.method, name, route.kind, cases, where)
        if route.action == "insert_manager":
            targets += self._act_as_template(args, body)
        caller = self.caller()
        try:
            gate.check(caller, SERVICE, route.method, targets)
        except Denied as denied:
            raise compute_errors.refusal(denied, gate.policy.project) from None

    def _act_as_template(self, args: dict, body: dict) -> list[Target]:
        """A group's VMs run as its template's service account, so its insert needs actAs on it:
        Google's "create a MIG" page asks for roles/iam.serviceAccountUser when the VMs use a
        service account; the dataset's method map (the catalog) does not list it."""
        svc: ComputeService = self.server.compute
        try:
            path = svc.ref(body.get("instanceTemplate"), "resource.instanceTemplate",
                           "instanceTemplates")  # fmt: skip
        except ComputeError:
            return []  # the insert refuses it, in its own words
        props = (svc.templates.get(path) or {}).get("properties") or {}
        emails = [a.get("email") for a in props.get("serviceAccounts") or [] if a.get("email")]
        account = f"projects/{args['project']}/serviceAccounts/{emails[0]}" if emails else None
        return [Target(ACT_AS, account, "iam.googleapis.com/ServiceAccount")] if account else []

    do_GET = do_POST = do_DELETE = _handle  # noqa: N815 - http.server's naming


def _find(method: str, path: str) -> tuple[Route, re.Match]:
    for route in ROUTES:
        if route.verb == method and (match := route.pattern.fullmatch(path)):
            return route, match
    raise ComputeError(404, "notFound", f"The requested URL {path} was not found.")


def _json(raw: bytes) -> dict:
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ComputeError(400, "parseError", f"Parse Error: {err}") from None
    if not isinstance(body, dict):
        raise ComputeError(400, "parseError", "Parse Error: the body is not a JSON object")
    return body


class ComputeApiServer(LoopbackServer):
    """`url` ends in "/": the root a client's endpoint override takes."""

    def __init__(self, compute: ComputeService, gate=None) -> None:
        super().__init__(_Handler, gate)
        self.compute = compute
        self.faults = compute.faults
        self.url += "/"
        compute.root = f"{self.url}compute/v1/"
