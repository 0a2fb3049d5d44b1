"""The local cloud is as strict as Google's: identities, tokens, IAM and enabled services.

Against a 2-worker pod (tests/localpod/conftest.py) enforcing stack v4-32's IAM, through Google's
own clients and gcloud: each identity's token is accepted as that identity and refused what its
grants do not hold, with Google's answers."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud import storage, tpu_v2
from google.oauth2.credentials import Credentials

from localpod.gcp import authz, identities, tokens
from localpod.gcp.authz import POLICY_FILE
from localpod.gcp.iam_policy import Policy

pytestmark = pytest.mark.e2e


def static(token: str) -> Credentials:
    """The token as it is: google-auth's "refresh" after a 401 hands back the same one, so the
    401 reaches the caller as google-api-core's Unauthorized."""
    later = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(hours=1)
    return Credentials(token=token, refresh_handler=lambda request, scopes=None: (token, later))


def client(endpoints: dict, token: str) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(transport="rest", credentials=static(token),
                            client_options={"api_endpoint": endpoints["tpu_api"].rstrip("/")})  # fmt: skip


def body(err: exceptions.GoogleAPICallError) -> dict:
    return err.response.json()["error"]


@pytest.fixture(scope="module")
def watcher(pod) -> dict:
    """The watcher's identity (what `local up --watcher` adds before its VM boots)."""
    policy = Policy.from_json(json.loads((pod.paths.root / POLICY_FILE).read_text()))
    return identities.add_watcher(pod.paths.root, policy, pod.paths.endpoints)


def test_endpoints_name_every_identity_with_a_token_file(pod, endpoints, watcher) -> None:
    found = pod.endpoints()["identities"]
    assert set(found) == {"operator", "worker-0", "worker-1", "watcher"}
    assert found["operator"]["email"] == "operator@example.com"
    assert found["worker-0"]["email"] == found["worker-1"]["email"] == (
        "tpupod-local@tpupod-local.iam.gserviceaccount.com")  # fmt: skip
    assert found["watcher"]["email"] == "tpupod-local-watch@tpupod-local.iam.gserviceaccount.com"
    key = tokens.read_key(pod.paths.root)
    for name, identity in found.items():
        token = Path(identity["token_file"]).read_text().strip()
        assert tokens.verify(key, token) == (identity["email"], ""), name
        assert oct(Path(identity["token_file"]).stat().st_mode & 0o777) == "0o600"


def test_each_token_is_its_identity_and_gets_only_its_grants(pod, endpoints, parent, watcher):
    node = f"{parent}/nodes/local"
    worker = client(endpoints, identities.token(pod.endpoints(), "worker-0"))
    with pytest.raises(exceptions.Forbidden) as denied:
        worker.get_node(name=node)
    error = body(denied.value)
    assert error["status"] == "PERMISSION_DENIED"
    (info,) = error["details"]
    assert info["reason"] == "IAM_PERMISSION_DENIED"
    assert info["metadata"] == {"permission": "tpu.nodes.get", "resource": node}
    assert f"'//tpu.googleapis.com/{node}'" in error["message"]
    watching = client(endpoints, identities.token(pod.endpoints(), "watcher"))
    assert watching.get_node(name=node).state == tpu_v2.Node.State.READY  # its custom role
    list(watching.list_queued_resources(parent=parent))  # tpu.nodes.list authorises this too
    with pytest.raises(exceptions.Forbidden):
        watching.update_node(
            node=tpu_v2.Node(name=node, description="x"), update_mask={"paths": ["description"]}
        )  # no tpu.nodes.update


def test_a_bad_an_expired_and_another_pods_token_are_401(pod, endpoints, parent) -> None:
    key = tokens.read_key(pod.paths.root)
    email = pod.endpoints()["identities"]["operator"]["email"]
    cases = {
        "ACCESS_TOKEN_EXPIRED": tokens.mint(key, email, lifetime_s=-1),
        "ACCESS_TOKEN_TYPE_UNSUPPORTED": tokens.mint(b"another pod's key" * 2, email),
    }
    for reason, token in cases.items():
        with pytest.raises(exceptions.Unauthorized) as refused:
            client(endpoints, token).list_nodes(parent=parent)
        assert body(refused.value)["status"] == "UNAUTHENTICATED"
        assert body(refused.value)["details"][0]["reason"] == reason
    request = urllib.request.Request(f"{endpoints['tpu_api']}v2/{parent}/nodes")
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request, timeout=10)
    assert missing.value.code == 401
    assert json.loads(missing.value.read())["error"]["details"][0]["reason"] == (
        "CREDENTIALS_MISSING")  # fmt: skip


def test_a_service_the_stack_did_not_enable_is_service_disabled(pod, endpoints) -> None:
    """Stack v4-32 runs no job with secrets: Secret Manager stays off, as in a new project."""
    url = (f"{endpoints['secretmanager']}/v1/projects/{endpoints['project']}/secrets/s/versions/"
           "latest:access")  # fmt: skip
    token = identities.token(pod.endpoints(), "worker-0")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with pytest.raises(urllib.error.HTTPError) as off:
        urllib.request.urlopen(request, timeout=10)
    assert off.value.code == 403
    error = json.loads(off.value.read())["error"]
    info = next(d for d in error["details"] if d["@type"].endswith("ErrorInfo"))
    assert (error["status"], info["reason"]) == ("PERMISSION_DENIED", "SERVICE_DISABLED")
    assert info["metadata"]["service"] == "secretmanager.googleapis.com"
    assert "Enable it by visiting https://console.developers.google.com/apis/api/" in (
        error["message"])  # fmt: skip


def test_storage_answers_as_the_json_api_does(pod, endpoints, watcher) -> None:
    """A worker reads bundles but not the watcher's state; the watcher the opposite; a forged
    token is 401 even at a VM's own storage URL."""
    bucket, url = endpoints["bucket"], endpoints["storage"]
    names = {"ops/local/lease.json": "watcher", "bundles/x.tar.gz": "operator"}
    for name in names:
        owner = storage.Client(project="p", client_options={"api_endpoint": url},
                               credentials=Credentials(token=identities.operator_token(endpoints)))  # fmt: skip
        owner.bucket(bucket).blob(name).upload_from_string(b"{}")
    as_worker = storage.Client(project="p", client_options={"api_endpoint": url}, credentials=(
        Credentials(token=identities.token(pod.endpoints(), "worker-0"))))  # fmt: skip
    as_watcher = storage.Client(project="p", client_options={"api_endpoint": url}, credentials=(
        Credentials(token=identities.token(pod.endpoints(), "watcher"))))  # fmt: skip
    assert as_worker.bucket(bucket).blob("bundles/x.tar.gz").download_as_bytes() == b"{}"
    with pytest.raises(exceptions.Forbidden) as denied:
        as_worker.bucket(bucket).blob("ops/local/lease.json").download_as_bytes()
    error = body(denied.value)
    assert error["errors"][0]["reason"] == "forbidden" and error["code"] == 403
    assert "storage.objects.get" in error["message"] and "tpupod-local@" in error["message"]
    assert as_watcher.bucket(bucket).blob("ops/local/lease.json").download_as_bytes() == b"{}"
    with pytest.raises(exceptions.Forbidden):
        as_watcher.bucket(bucket).blob("bundles/x.tar.gz").upload_from_string(b"forged")
    forged = tokens.mint(b"not the pod's key" * 2, "operator@example.com")
    request = urllib.request.Request(f"{url}/storage/v1/b/{bucket}/o",
                                     headers={"Authorization": f"Bearer {forged}"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(request, timeout=10)
    assert bad.value.code == 401
    assert json.loads(bad.value.read())["error"]["errors"][0]["reason"] == "authError"


def test_every_decision_is_in_the_audit_log(pod) -> None:
    audit = authz.read_audit(pod.paths.root)
    denied = [a for a in audit if not a["allowed"]]
    assert any(a["permission"] == "tpu.nodes.get" and a["member"].endswith(
        "tpupod-local@tpupod-local.iam.gserviceaccount.com") for a in denied)  # fmt: skip
    granted = {(a["member"], a["role"]) for a in audit if a["allowed"]}
    assert ("user:operator@example.com", "roles/owner") in granted


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="no gcloud CLI")
def test_gcloud_with_each_identitys_token(pod, endpoints, watcher, tmp_path) -> None:
    """The issue's must-show: gcloud with --access-token-file is that identity."""
    env = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud")}

    def gcloud(*args: str, extra: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["gcloud", *args], env={**env, **(extra or {})},
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    assert (
        gcloud("config", "set", "api_endpoint_overrides/tpu", endpoints["tpu_api"]).returncode == 0
    )
    assert gcloud("config", "set", "project", endpoints["project"]).returncode == 0
    found = pod.endpoints()["identities"]
    zone = ["--zone", endpoints["zone"]]
    refused = gcloud("compute", "tpus", "tpu-vm", "delete", "local", *zone, "--quiet",
                     "--access-token-file", found["worker-0"]["token_file"])  # fmt: skip
    assert refused.returncode != 0
    assert "PERMISSION_DENIED" in refused.stderr and "tpu.nodes.delete" in refused.stderr
    listed = gcloud("compute", "tpus", "queued-resources", "list", *zone, "--format=json",
                    "--access-token-file", found["watcher"]["token_file"])  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert isinstance(json.loads(listed.stdout), list)
    anonymous = gcloud("compute", "tpus", "queued-resources", "list", *zone,
                       extra={"CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true"})  # fmt: skip
    assert anonymous.returncode != 0 and "UNAUTHENTICATED" in anonymous.stderr
    assert pod.describe().state == "READY"  # nothing above touched the node
