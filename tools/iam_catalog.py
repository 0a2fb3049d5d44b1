"""Build contract/iam_catalog.json from a checkout of iann0036/iam-dataset (its `gcp/` folder).

    uv run python -m tools.iam_catalog /path/to/iam-dataset [--commit SHA --date YYYY-MM-DD]

The dataset is a machine-readable copy of Google's IAM reference: `gcp/roles/*.json` (each
predefined role's `includedPermissions`) and `gcp/map.json` (each REST method's permissions).
tpupod ships the part it touches: the permissions of the services below (valid permissions are
the union of every predefined role's), the predefined roles a stack may grant, and the methods the
local cloud serves or the GCP path calls. Where Google checks a permission only in some cases
(an overwrite, a service account in the body), `when` names the case; those rules come from
Google's per-method IAM pages, not the dataset, and are listed in CONDITIONAL.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "contract" / "iam_catalog.json"
# Permission prefix -> the service whose API checks it.
SERVICES = {
    "tpu": "tpu.googleapis.com",
    "storage": "storage.googleapis.com",
    "secretmanager": "secretmanager.googleapis.com",
    "iam": "iam.googleapis.com",
    "compute": "compute.googleapis.com",
    "logging": "logging.googleapis.com",
    "monitoring": "monitoring.googleapis.com",
    "resourcemanager": "cloudresourcemanager.googleapis.com",
    "serviceusage": "serviceusage.googleapis.com",
    "iap": "iap.googleapis.com",
    "oslogin": "oslogin.googleapis.com",
}
ROLES = (
    "roles/owner", "roles/editor", "roles/viewer",
    "roles/tpu.admin", "roles/tpu.editor", "roles/tpu.viewer",
    "roles/storage.admin", "roles/storage.bucketViewer", "roles/storage.objectAdmin",
    "roles/storage.objectUser",
    "roles/storage.objectCreator", "roles/storage.objectViewer",
    "roles/storage.legacyBucketOwner", "roles/storage.legacyBucketReader",
    "roles/storage.legacyObjectOwner", "roles/storage.legacyObjectReader",
    "roles/secretmanager.secretAccessor", "roles/secretmanager.admin",
    "roles/logging.logWriter", "roles/monitoring.metricWriter",
    "roles/compute.osLogin", "roles/compute.osAdminLogin", "roles/compute.instanceAdmin.v1",
    "roles/iam.serviceAccountUser", "roles/iap.tunnelResourceAccessor",
)  # fmt: skip
# Whole APIs, and the Compute Engine collections a slice through Compute Engine uses.
METHOD_APIS = ("tpu", "storage", "secretmanager", "oslogin")
COMPUTE_COLLECTIONS = ("instances", "instanceTemplates", "regionInstanceTemplates",
                       "resourcePolicies", "instanceGroupManagers", "zoneOperations",
                       "regionOperations", "globalOperations")  # fmt: skip
# The dataset's body conditions, by the name the local cloud uses for the case.
BODY_CONDITIONS = {
    "$.serviceAccount.email": "service_account",
    "$.properties.serviceAccounts[].email": "service_account",
    "$.instanceProperties.serviceAccounts[].email": "service_account",
    "$.serviceAccounts[].email": "service_account",
}
# (method, permission) -> the case in which Google checks it (Cloud Storage's "IAM permissions
# for JSON methods" page: delete only when an object is overwritten, getIamPolicy/setIamPolicy
# only with ACLs (projection=full or an ACL in the body)).
CONDITIONAL = {
    ("storage.objects.insert", "storage.objects.delete"): "overwrite",
    ("storage.objects.compose", "storage.objects.delete"): "overwrite",
    ("storage.objects.copy", "storage.objects.delete"): "overwrite",
    ("storage.objects.rewrite", "storage.objects.delete"): "overwrite",
    ("storage.objects.get", "storage.objects.getIamPolicy"): "acl",
    ("storage.objects.list", "storage.objects.getIamPolicy"): "acl",
    ("storage.buckets.get", "storage.buckets.getIamPolicy"): "acl",
    ("storage.buckets.list", "storage.buckets.getIamPolicy"): "acl",
    ("storage.objects.patch", "storage.objects.get"): "acl",
    ("storage.objects.patch", "storage.objects.getIamPolicy"): "acl",
    ("storage.objects.patch", "storage.objects.setIamPolicy"): "acl",
    ("storage.objects.update", "storage.objects.setIamPolicy"): "acl",
    ("storage.buckets.patch", "storage.buckets.getIamPolicy"): "acl",
    ("storage.buckets.patch", "storage.buckets.setIamPolicy"): "acl",
}
# What tpupod adds, each with why (not in the dataset's map).
ADDED = {
    # A queued resource creates its node as nodes.create does, running as the node's account.
    "tpu.projects.locations.queuedResources.create": [
        {"permission": "iam.serviceAccounts.actAs", "when": "service_account"}
    ],
    # Not a REST method: the guest's OS Login check when a POSIX user logs in over SSH with sudo
    # (Google: roles/compute.osAdminLogin grants it; roles/compute.osLogin logs in without sudo).
    "oslogin.login.admin": [{"permission": "compute.instances.osAdminLogin"}],
    # Not a REST method either: IAP's check when a TCP tunnel to an instance opens (gcloud
    # compute start-iap-tunnel; Google: roles/iap.tunnelResourceAccessor grants it).
    "iap.tunnelInstances.connect": [{"permission": "iap.tunnelInstances.accessViaIAP"}],
}
NOTES = {
    "roles": "each role's permissions kept only where their prefix is in `services`",
    "tpu.projects.locations.queuedResources.create": "actAs added by tpupod: the request's node "
    "runs as the account its nodeSpec names, as nodes.create's does",
    "oslogin.login.admin": "not a REST method: the OS Login check at an SSH login with sudo",
    "iap.tunnelInstances.connect": "not a REST method: IAP's check when a tunnel opens",
}


def _role_permissions(gcp: Path) -> dict[str, list[str]]:
    roles = {}
    for path in sorted((gcp / "roles").glob("*.json")):
        role = json.loads(path.read_text())
        roles[role["name"]] = sorted(role.get("includedPermissions") or [])
    return roles


def _covered(permission: str) -> bool:
    return permission.split(".", 1)[0] in SERVICES


def _methods(gcp: Path) -> dict[str, list[dict]]:
    apis = json.loads((gcp / "map.json").read_text())["api"]
    wanted = {}
    for api in METHOD_APIS:
        wanted.update(apis[api]["methods"])
    for name, method in apis["compute"]["methods"].items():
        if name.split(".")[1] in COMPUTE_COLLECTIONS:
            wanted[name] = method
    out = {}
    for name, method in sorted(wanted.items()):
        checks = []
        for entry in method.get("permissions") or []:
            check = {"permission": entry["name"]}
            body = (entry.get("condition") or {}).get("bodyPathExists")
            when = BODY_CONDITIONS.get(body) if body else CONDITIONAL.get((name, entry["name"]))
            if body and when is None:
                raise SystemExit(f"{name}: unknown body condition {body}")
            if when:
                check["when"] = when
            if check not in checks:
                checks.append(check)
        out[name] = checks + ADDED.get(name, [])
    for name, checks in ADDED.items():
        out.setdefault(name, checks)
    return out


def build(dataset: Path, commit: str, date: str) -> dict:
    gcp = dataset / "gcp"
    roles = _role_permissions(gcp)
    valid = sorted({p for perms in roles.values() for p in perms if _covered(p)})
    missing = [r for r in ROLES if r not in roles]
    if missing:
        raise SystemExit(f"roles not in the dataset: {', '.join(missing)}")
    return {
        "source": {
            "repository": "https://github.com/iann0036/iam-dataset",
            "commit": commit,
            "date": date,
            "files": ["gcp/roles/*.json", "gcp/map.json"],
            "built_by": "python -m tools.iam_catalog",
        },
        "notes": NOTES,
        "services": SERVICES,
        "permissions": valid,
        "roles": {r: [p for p in roles[r] if _covered(p)] for r in ROLES},
        "methods": _methods(gcp),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path, help="a checkout of iann0036/iam-dataset")
    parser.add_argument("--commit", required=True, help="the dataset's commit")
    parser.add_argument("--date", required=True, help="the commit's date, YYYY-MM-DD")
    args = parser.parse_args(argv)
    catalog = build(args.dataset, args.commit, args.date)
    OUT.write_text(json.dumps(catalog, indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: {len(catalog['permissions'])} permissions, {len(catalog['roles'])} roles, "
          f"{len(catalog['methods'])} methods")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
