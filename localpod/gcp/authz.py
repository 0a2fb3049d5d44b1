"""Authorisation in the local cloud: who is calling, is the service on, may they do it.

Every local API asks the one `Gate` of its process: the caller's identity from its bearer token
(localpod.gcp.tokens) or, for a request with none where the API lets it (the storage emulator's
per-VM endpoints), from the endpoint it came in on; then whether the stack enabled the API's
service; then, for each permission the method needs (contract.iam: the catalog's method ->
permission map), whether some binding of the stack's policy (localpod.gcp.iam_policy) on the resource
or one of its ancestors grants a role holding it, its IAM Condition (CEL: `resource.name`,
`resource.type`, `api.getAttribute`) true. Every decision is appended to the pod's audit log
(`iam/audit.jsonl`, once per distinct grant): what a least-privilege check measures.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from contract.iam import Catalog, catalog
from localpod.gcp import tokens
from localpod.gcp.iam_policy import Binding, Policy

POLICY_FILE = "iam/policy.json"
AUDIT_FILE = "iam/audit.jsonl"
SERVICE_ACCOUNT_DOMAIN = ".iam.gserviceaccount.com"
CONVENIENCE = {"roles/owner": "projectOwner", "roles/editor": "projectEditor",
               "roles/viewer": "projectViewer"}  # fmt: skip


@dataclass(frozen=True)
class Target:
    """One permission on one resource: `name` as IAM names it (projects/P/locations/Z/nodes/N,
    projects/_/buckets/B/objects/O), `type` as IAM Conditions see it."""

    permission: str
    name: str
    type: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)  # api.getAttribute's


@dataclass(frozen=True)
class Caller:
    member: str | None  # serviceAccount:E / user:E; None: not authenticated
    problem: str = ""  # why not: "missing", "invalid", "expired"
    via: str = "token"  # "token", or "endpoint" (a storage request without one)

    @property
    def email(self) -> str:
        return (self.member or "").split(":", 1)[-1]


class Denied(Exception):
    """`kind`: "unauthenticated", "disabled" or "permission"; `target` for a permission."""

    def __init__(self, kind: str, caller: Caller, service: str, target: Target | None = None):
        super().__init__(kind)
        self.kind, self.caller, self.service, self.target = kind, caller, service, target


def member_of(email: str) -> str:
    kind = "serviceAccount" if email.endswith(SERVICE_ACCOUNT_DOMAIN) else "user"
    return f"{kind}:{email}"


def applies(binding: Binding, resource: str, project: str) -> bool:
    """A binding on the project holds for everything in it; one on a bucket, secret or account
    for it and what lies under it."""
    return (binding.resource == f"projects/{project}" or binding.resource == resource
            or resource.startswith(binding.resource + "/"))  # fmt: skip


@functools.lru_cache(maxsize=64)
def _program(expression: str):
    import logging

    import celpy

    logging.getLogger("celpy").setLevel(logging.WARNING)  # it traces every step at DEBUG
    env = celpy.Environment()
    return env.program(env.compile(expression), functions={"getAttribute": _get_attribute})


def _get_attribute(api, name, default):
    return api.get(name, default)


@functools.lru_cache(maxsize=8192)
def condition_holds(expression: str, name: str, type_: str, attributes: tuple) -> bool:
    from celpy import celtypes

    def strings(items) -> celtypes.MapType:
        return celtypes.MapType({celtypes.StringType(k): celtypes.StringType(v) for k, v in items})

    activation = {"resource": strings((("name", name), ("type", type_))),
                  "api": strings(attributes)}  # fmt: skip
    try:
        return bool(_program(expression).evaluate(activation))
    except Exception:  # noqa: BLE001 - IAM: a condition that errors grants nothing
        return False


class Gate:
    """One process's authoriser over the pod's policy; `audit` appends its decisions."""

    def __init__(self, policy: Policy, key: bytes, audit: Path | None = None,
                 cat: Catalog | None = None) -> None:  # fmt: skip
        self.policy, self.key, self.audit = policy, key, audit
        self.catalog = cat or catalog()
        self._seen: set[tuple] = set()
        self._lock = threading.Lock()

    @classmethod
    def for_pod(cls, pod_dir: Path) -> Gate | None:
        """The pod's gate, None when the pod enforces no IAM (no policy written)."""
        path = Path(pod_dir) / POLICY_FILE
        if not path.is_file():
            return None
        policy = Policy.from_json(json.loads(path.read_text()))
        return cls(policy, tokens.read_key(pod_dir), Path(pod_dir) / AUDIT_FILE)

    # -- who ------------------------------------------------------------------------------------
    def caller(self, authorization: str | None, endpoint_member: str | None = None) -> Caller:
        """From an `Authorization` header; a request without a token of ours is the endpoint's
        (`endpoint_member`, where the API attributes one) or unauthenticated."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and token.strip().startswith(tokens.PREFIX):
            email, problem = tokens.verify(self.key, token.strip())
            return Caller(member_of(email) if email else None, problem)
        if endpoint_member is not None:
            return Caller(endpoint_member, via="endpoint")
        return Caller(None, "invalid" if token.strip() else "missing")

    # -- may they -------------------------------------------------------------------------------
    def roles_of(self, member: str, target: Target) -> Iterable[Binding]:
        members = self.members_of(member)
        for binding in self.policy.bindings:
            if binding.member in members and applies(binding, target.name, self.policy.project):
                yield binding

    def members_of(self, member: str) -> set[str]:
        """`member`, and the convenience members it is (projectOwner:P when it holds
        roles/owner on project P; projectEditor, projectViewer likewise)."""
        project = f"projects/{self.policy.project}"
        found = {member}
        for binding in self.policy.bindings:
            convenience = CONVENIENCE.get(binding.role)
            if convenience and binding.member == member and binding.resource == project:
                found.add(f"{convenience}:{self.policy.project}")
        return found

    def granting(self, member: str, target: Target) -> str | None:
        """The role that grants `target` to `member`, None when none does."""
        for binding in self.roles_of(member, target):
            perms = self.catalog.role(binding.role, self.policy.custom_roles)
            if target.permission not in perms:
                continue
            attrs = tuple(sorted(target.attributes.items()))
            if binding.condition is None or condition_holds(
                binding.condition, target.name, target.type, attrs
            ):
                return binding.role
        return None

    def check(self, caller: Caller, service: str, method: str, targets: Iterable[Target]) -> None:
        """Raises Denied unless `caller` may call `method` (of `service`) on `targets`."""
        if caller.member is None:
            raise Denied("unauthenticated", caller, service)
        if service not in self.policy.services:
            self._record(caller, service, method, None, allowed=False, why="disabled")
            raise Denied("disabled", caller, service)
        for target in targets:
            role = self.granting(caller.member, target)
            self._record(caller, service, method, target, allowed=role is not None, role=role)
            if role is None:
                raise Denied("permission", caller, service, target)

    def targets(self, method: str, name: str, type_: str, cases: Iterable[str] = (),
                where: Mapping[str, tuple[str, str]] | None = None,
                attributes: Mapping[str, str] | None = None) -> list[Target]:  # fmt: skip
        """The catalog's permissions for `method` in `cases`, each on `name` unless `where`
        puts it on another resource (iam.serviceAccounts.actAs: the account)."""
        out = []
        for permission in self.catalog.needs(method, cases):
            on, kind = (where or {}).get(permission, (name, type_))
            out.append(Target(permission, on, kind, dict(attributes or {})))
        return out

    def _record(self, caller: Caller, service: str, method: str, target: Target | None,
                allowed: bool, role: str | None = None, why: str = "") -> None:  # fmt: skip
        if self.audit is None:
            return
        permission = target.permission if target else None
        resource = target.name if target else None
        key = (caller.member, method, permission, role, allowed) + (() if allowed else (resource,))
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        line = json.dumps({"member": caller.member, "via": caller.via, "service": service,
                           "method": method, "permission": permission, "resource": resource,
                           "allowed": allowed, "role": role, "why": why}) + "\n"  # fmt: skip
        fd = os.open(self.audit, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def read_audit(pod_dir: Path) -> list[dict]:
    path = Path(pod_dir) / AUDIT_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
