"""Least privilege, measured from an audit log: refusals, disabled services and roles never used
are found (each shown on a log that has one), roles for APIs with no local stand-in are not
judged."""

from __future__ import annotations

import json

from localpod.gcp.authz import AUDIT_FILE, POLICY_FILE
from localpod.gcp.iam_policy import Binding, Policy
from localpod.gcp.iam_report import summarize

WORKER = "serviceAccount:w@p.iam.gserviceaccount.com"
WATCHER = "serviceAccount:x@p.iam.gserviceaccount.com"
POLICY = Policy(
    stack="s", project="p", services=("storage.googleapis.com", "tpu.googleapis.com"),
    custom_roles={"projects/p/roles/watch": ["tpu.nodes.get"]},
    bindings=(
        Binding("projects/_/buckets/b", "roles/storage.objectUser", WORKER, "cond"),
        Binding("projects/p", "roles/logging.logWriter", WORKER),
        Binding("projects/p", "projects/p/roles/watch", WATCHER),
        Binding("projects/p", "roles/compute.osAdminLogin", WATCHER),
        Binding("projects/_/buckets/b", "roles/storage.legacyBucketOwner", "projectOwner:p"),
    ),
)  # fmt: skip


def decision(member, permission, role, allowed=True, why=""):
    return {"member": member, "permission": permission, "role": role, "allowed": allowed,
            "resource": "r", "method": "m", "service": "s", "via": "token", "why": why}  # fmt: skip


def write(tmp_path, audit: list[dict]):
    (tmp_path / "iam").mkdir(exist_ok=True)
    (tmp_path / POLICY_FILE).write_text(json.dumps(POLICY.to_json()))
    (tmp_path / AUDIT_FILE).write_text("".join(json.dumps(a) + "\n" for a in audit))
    return summarize(tmp_path)


def test_every_role_used_and_every_call_allowed_is_least_privilege(tmp_path):
    report = write(tmp_path, [
        decision(WORKER, "storage.objects.get", "roles/storage.objectUser"),
        decision(WATCHER, "tpu.nodes.get", "projects/p/roles/watch"),
        decision(WATCHER, "compute.instances.osAdminLogin", "roles/compute.osAdminLogin"),
    ])  # fmt: skip
    assert report.least_privilege, report.lines()
    assert report.unserved == {WORKER: ["roles/logging.logWriter"]}  # no local Cloud Logging


def test_a_role_never_used_a_refusal_and_a_disabled_service_are_each_found(tmp_path):
    unused = write(tmp_path, [
        decision(WORKER, "storage.objects.get", "roles/storage.objectUser"),
        decision(WATCHER, "tpu.nodes.get", "projects/p/roles/watch"),
    ])  # fmt: skip
    assert unused.unused[WATCHER] == ["roles/compute.osAdminLogin"] and not unused.least_privilege
    refused = write(tmp_path, [
        decision(WORKER, "storage.objects.get", "roles/storage.objectUser"),
        decision(WORKER, "tpu.nodes.delete", None, allowed=False),
    ])  # fmt: skip
    assert [d["permission"] for d in refused.denied] == ["tpu.nodes.delete"]
    assert "refused: " + WORKER + " tpu.nodes.delete on r" in refused.lines()
    disabled = write(tmp_path, [decision(WORKER, None, None, allowed=False, why="disabled")])
    assert len(disabled.disabled) == 1 and not disabled.denied and not disabled.least_privilege
