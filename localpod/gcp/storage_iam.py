"""Cloud Storage's authorisation in the pod's storage emulator: each JSON API request (and each
part of a batch) is one REST method of the IAM catalog, checked by the pod's gate (localpod.gcp.authz)
before the emulator serves it, and refused as GCS refuses: 401 `required` / `authError`, 403
`forbidden` naming the permission, 403 `accessNotConfigured` for a disabled service.

Who calls: a bearer token of the pod's names its identity. Storage clients in emulator mode send
none (google-cloud-storage under STORAGE_EMULATOR_HOST forces anonymous credentials, gcsfs runs
`anon`, tensorstore sends its fixed test token), so a request without one is the machine's whose
storage URL it called: every VM has its own (its address, the emulator's port), as it has its own
metadata server, and the operator's is 127.0.0.1 (Orbax's own storage client, on the operator's
machine too, is anonymous in emulator mode). A token that claims to be the pod's and is not (bad
or expired) is 401 wherever it is sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote

from localpod.gcp import gcp_errors
from localpod.gcp.authz import Caller, Denied, Gate, Target

SERVICE = "storage.googleapis.com"
OBJECT = "storage.googleapis.com/Object"
BUCKET = "storage.googleapis.com/Bucket"
PROJECT = "cloudresourcemanager.googleapis.com/Project"
LIST_PREFIX = "storage.googleapis.com/objectListPrefix"
_B = r"(?P<bucket>[-.\w]+)"
_O = r"(?P<object>.*[^/]+)"
_API = r"(?:/storage/v1)?"
# (HTTP method, path) -> the REST method id (contract/iam_catalog.json).
ROUTES: list[tuple[str, re.Pattern, str]] = [
    (verb, re.compile(pattern), method)
    for verb, pattern, method in (
        ("GET", _API + r"/b", "storage.buckets.list"),
        ("POST", _API + r"/b", "storage.buckets.insert"),
        ("GET", _API + rf"/b/{_B}", "storage.buckets.get"),
        ("DELETE", _API + rf"/b/{_B}", "storage.buckets.delete"),
        ("PATCH", _API + rf"/b/{_B}", "storage.buckets.patch"),
        ("GET", _API + rf"/b/{_B}/(?:acl|defaultObjectAcl)", "storage.buckets.getIamPolicy"),
        ("GET", _API + rf"/b/{_B}/iam", "storage.buckets.getIamPolicy"),
        ("PUT", _API + rf"/b/{_B}/iam", "storage.buckets.setIamPolicy"),
        ("GET", _API + rf"/b/{_B}/iam/testPermissions", "storage.buckets.testIamPermissions"),
        ("GET", _API + rf"/b/{_B}/o", "storage.objects.list"),
        ("POST", _API + rf"/b/{_B}/o", "storage.objects.insert"),
        ("POST", _API + rf"/b/{_B}/o/{_O}/copyTo/b/(?P<dbucket>[-.\w]+)/o/(?P<dobject>.*[^/]+)",
         "storage.objects.copy"),
        ("POST", _API + rf"/b/{_B}/o/{_O}/rewriteTo/b/(?P<dbucket>[-.\w]+)/o/(?P<dobject>.*[^/]+)",
         "storage.objects.rewrite"),
        ("POST", _API + rf"/b/{_B}/o/{_O}/compose", "storage.objects.compose"),
        ("GET", _API + rf"/b/{_B}/o/{_O}/acl", "storage.objects.getIamPolicy"),
        ("POST", _API + rf"/b/{_B}/o/{_O}/restore", "storage.objects.restore"),
        ("GET", _API + rf"/b/{_B}/o/{_O}", "storage.objects.get"),
        ("DELETE", _API + rf"/b/{_B}/o/{_O}", "storage.objects.delete"),
        ("PATCH", _API + rf"/b/{_B}/o/{_O}", "storage.objects.patch"),
        ("POST", rf"/upload/storage/v1/b/{_B}/o", "storage.objects.insert"),
        ("GET", rf"/download/storage/v1/b/{_B}/o/{_O}", "storage.objects.get"),
        ("GET", r"/", "health"),
        ("GET", rf"/{_B}/{_O}", "storage.objects.get"),  # the XML API
        ("PUT", rf"/{_B}/{_O}", "storage.objects.insert"),
    )
]  # fmt: skip
BATCH_METHODS = {"DELETE": "storage.objects.delete", "PATCH": "storage.objects.patch",
                 "POST": "storage.objects.copy"}  # fmt: skip


@dataclass
class Call:
    """One request as IAM sees it: the method and every permission on what it is checked on."""

    method: str
    targets: list[Target] = field(default_factory=list)
    kind: str = "object"  # how GCS's message names the resource


def object_name(bucket: str, name: str) -> str:
    return f"projects/_/buckets/{bucket}/objects/{name}"


def bucket_name(bucket: str) -> str:
    return f"projects/_/buckets/{bucket}"


def route(verb: str, path: str) -> tuple[str, dict] | None:
    """(method id, path parameters); None for a path GCS would not serve."""
    for method, pattern, name in ROUTES:
        if method == verb and (match := pattern.fullmatch(path)):
            return name, {k: unquote(v) if v else v for k, v in match.groupdict().items()}
    return None


def call(gate: Gate, method: str, params: dict, query: dict, exists: Callable[[str, str], bool],
         body: Callable[[], object]) -> Call:  # fmt: skip
    """The targets of one request: `exists(bucket, name)` tells an overwrite; `body()` the parsed
    body (an insert's name, a compose's sources)."""
    project = gate.policy.project
    cases = {"acl"} if (query.get("projection") or [""])[0] == "full" else set()
    bucket, name = params.get("bucket"), params.get("object")
    if method in ("storage.buckets.list", "storage.buckets.insert"):
        return Call(method, gate.targets(method, f"projects/{project}", PROJECT), "project")
    if method == "storage.objects.insert" and name is None:
        name = (query.get("name") or [None])[0] or _meta_name(body())
    if method.startswith("storage.buckets.") or method == "storage.objects.list":
        prefix = (query.get("prefix") or [""])[0]
        attrs = {LIST_PREFIX: prefix} if method == "storage.objects.list" else {}
        return Call(method, gate.targets(method, bucket_name(bucket), BUCKET, cases,
                                         attributes=attrs), "bucket")  # fmt: skip
    dest_bucket, dest = params.get("dbucket") or bucket, params.get("dobject") or name
    if dest and method in ("storage.objects.insert", "storage.objects.copy",
                           "storage.objects.rewrite", "storage.objects.compose") and exists(
                               dest_bucket, dest):  # fmt: skip
        cases.add("overwrite")
    target = object_name(dest_bucket, dest or "")
    targets = gate.targets(method, target, OBJECT, cases)
    if method in ("storage.objects.copy", "storage.objects.rewrite"):
        targets = [Target(t.permission, object_name(bucket, name), OBJECT)
                   if t.permission == "storage.objects.get" else t for t in targets]  # fmt: skip
    elif method == "storage.objects.compose":
        sources = [s.get("name") for s in (_dict(body()).get("sourceObjects") or [])]
        targets = [t for t in targets if t.permission != "storage.objects.get"] + [
            Target("storage.objects.get", object_name(bucket, s), OBJECT) for s in sources if s
        ]
    return Call(method, targets)


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _meta_name(data: object) -> str | None:
    """A multipart or resumable insert names its object in the metadata part."""
    data = _dict(data)
    return data.get("name") or _dict(data.get("meta")).get("name")


def refusal(denied: Denied, gate: Gate, kind: str) -> tuple[int, dict]:
    """GCS's answer to a refused call: (HTTP status, JSON body)."""
    if denied.kind == "disabled":
        return gcp_errors.gcs_disabled(gate.policy.project)
    permission = denied.target.permission if denied.target else "storage.objects.get"
    if denied.kind == "unauthenticated":
        return gcp_errors.gcs_unauthenticated(denied.caller.problem, permission, kind)
    return gcp_errors.gcs_forbidden(denied.caller.email, permission, kind)


def check(gate: Gate, caller: Caller, found: Call) -> tuple[int, dict] | None:
    """None when `caller` may make `found`; else GCS's refusal."""
    try:
        gate.check(caller, SERVICE, found.method, found.targets)
    except Denied as denied:
        return refusal(denied, gate, found.kind)
    return None
