"""The IAM catalog (contract/iam_catalog.json): where it comes from, and that it holds every
method the GCP path calls, so the local cloud can authorise each one as Google does."""

from __future__ import annotations

import ast
from pathlib import Path

from contract.iam import CATALOG_PATH, catalog

ROOT = Path(__file__).resolve().parents[2]
# google-cloud-tpu's TpuClient methods -> the REST method each one calls.
TPU_CLIENT = {
    f"{verb}_{noun}": f"tpu.projects.locations.{rest}"
    for verb, noun, rest in (
        ("get", "node", "nodes.get"), ("list", "nodes", "nodes.list"),
        ("create", "node", "nodes.create"), ("delete", "node", "nodes.delete"),
        ("update", "node", "nodes.patch"), ("get", "guest_attributes", "nodes.getGuestAttributes"),
        ("get", "operation", "operations.get"),
        ("get", "queued_resource", "queuedResources.get"),
        ("list", "queued_resources", "queuedResources.list"),
        ("create", "queued_resource", "queuedResources.create"),
        ("delete", "queued_resource", "queuedResources.delete"),
    )
}  # fmt: skip
# What the GCP path calls besides the TPU API, and the REST method behind each.
OTHER_CALLS = {
    "storage: Bucket.list_blobs": "storage.objects.list",
    "storage: Blob.download_as_bytes / get_blob": "storage.objects.get",
    "storage: Blob.upload_from_string": "storage.objects.insert",
    "storage: Blob.delete": "storage.objects.delete",
    "storage: Client.get_bucket (Orbax's hierarchical-namespace check)": "storage.buckets.get",
    "bootstrap/jobrun.py: secrets.versions.access": "secretmanager.projects.secrets.versions.access",
    "ops/fleet/oslogin.py: users.importSshPublicKey": "oslogin.users.importSshPublicKey",
    "OS Login at a watcher's SSH login with sudo": "oslogin.login.admin",
}


def client_calls() -> set[str]:
    """Every `<...>.client.<method>` the product's ops package calls on the TPU client."""
    found = set()
    for path in (ROOT / "ops").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "client"
                and path.name in ("tpu.py", "queued.py")
            ):
                found.add(node.attr)  # fmt: skip
    return found


def test_the_catalog_names_its_source() -> None:
    source = catalog().source
    assert source["repository"] == "https://github.com/iann0036/iam-dataset"
    assert len(source["commit"]) == 40 and source["date"].count("-") == 2
    assert CATALOG_PATH.read_text().count("\n") > 1000  # data, not a stub


def test_every_method_the_gcp_path_calls_is_in_the_catalog() -> None:
    calls = client_calls()
    assert calls and calls <= set(TPU_CLIENT), f"new TPU client calls: {calls - set(TPU_CLIENT)}"
    for method in [*TPU_CLIENT.values(), *OTHER_CALLS.values()]:
        assert method in catalog().methods, method
        assert catalog().needs(method) or method == "oslogin.users.importSshPublicKey", method


def test_queued_resources_are_authorised_by_node_permissions() -> None:
    """IAM has no tpu.queuedResources.* permissions (the fact behind the watcher's old role)."""
    cat = catalog()
    assert not [p for p in cat.permissions if p.startswith("tpu.queuedResources.")]
    assert cat.needs("tpu.projects.locations.queuedResources.get") == ["tpu.nodes.get"]
    assert cat.needs("tpu.projects.locations.queuedResources.create", ["service_account"]) == [
        "tpu.nodes.create", "iam.serviceAccounts.actAs"]  # fmt: skip
    assert cat.unknown(["tpu.queuedResources.get", "tpu.nodes.get"]) == [
        "tpu.queuedResources.get"]  # fmt: skip


def test_conditional_permissions_are_checked_only_in_their_case() -> None:
    cat = catalog()
    assert cat.needs("storage.objects.insert") == ["storage.objects.create"]
    assert cat.needs("storage.objects.insert", ["overwrite"]) == [
        "storage.objects.create", "storage.objects.delete"]  # fmt: skip
    assert cat.needs("tpu.projects.locations.nodes.create") == ["tpu.nodes.create"]


def test_owner_reaches_objects_only_through_the_buckets_own_policy() -> None:
    """roles/owner grants no object access (Google's basic roles); legacy bucket roles do."""
    cat = catalog()
    assert "storage.objects.get" not in cat.role("roles/owner")
    assert "storage.objects.get" in cat.role("roles/storage.legacyObjectOwner")
