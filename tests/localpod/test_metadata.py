"""The pod's GCE metadata server speaks GCE's protocol (issue 14 item 6), checked over HTTP and
with google-auth itself: service accounts, tpu-env, ETags, wait_for_change, alt=json, 405."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from localpod import procs
from localpod.gcp import tokens
from localpod.vm.metadata_server import MetadataServer, MetadataStore

ADDRESSES = ["127.0.0.1", "127.0.0.2"]
ACCOUNT = "trainer@proj-a.iam.gserviceaccount.com"
KEY = b"k" * 32  # a pod's token key (localpod.gcp.tokens)


@pytest.fixture
def store() -> MetadataStore:
    store = MetadataStore(token_key=KEY)
    attributes = {i: {"accelerator-type": "v4-16", "agent-worker-number": str(i)} for i in (0, 1)}
    store.set_attributes(attributes, {0: "t1v-n-0a1b2c3d-w-0", 1: "t1v-n-0a1b2c3d-w-1"})
    store.set_node(
        node_id="trainer", project="proj-a", zone="us-central2-b", service_account=ACCOUNT
    )
    return store


@pytest.fixture
def hosts(store: MetadataStore) -> Iterator[list[str]]:
    port = procs.free_port_on_all(ADDRESSES)
    server = MetadataServer(ADDRESSES, port, store)
    server.start()
    try:
        yield [f"{address}:{port}" for address in ADDRESSES]
    finally:
        server.stop()


def get(host: str, path: str, method: str = "GET", flavor: bool = True):
    """(status, body, headers) of one request, errors included."""
    url = f"http://{host}/computeMetadata/v1/{path}"
    headers = {"Metadata-Flavor": "Google"} if flavor else {}
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode(), resp.headers
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), err.headers


def test_service_accounts_as_gce_lists_them(hosts: list[str]) -> None:
    host = hosts[0]
    assert get(host, "instance/service-accounts/")[1] == f"default/\n{ACCOUNT}/\n"
    listing = get(host, "instance/service-accounts/default/")[1]
    assert listing == "aliases\nemail\nscopes\ntoken\n"
    _, body, headers = get(host, "instance/service-accounts/default/?recursive=true")
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {
        "aliases": ["default"],
        "email": ACCOUNT,
        "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
    }
    assert get(host, f"instance/service-accounts/{ACCOUNT}/email")[1] == ACCOUNT
    token = json.loads(get(host, "instance/service-accounts/default/token?scopes=x")[1])
    assert token["token_type"] == "Bearer" and token["expires_in"] > 0
    whole = json.loads(get(host, "instance/?recursive=true")[1])
    assert whole["serviceAccounts"]["default"]["email"] == ACCOUNT  # GCE's camelCase names
    assert whole["attributes"]["agent-worker-number"] == "0"  # attribute names kept as set


def test_tpu_env_has_a_tpu_vms_keys_per_worker(hosts: list[str]) -> None:
    env = get(hosts[1], "instance/attributes/tpu-env")[1]
    lines = env.splitlines()
    assert lines == sorted(lines)
    values = dict(line.split(": ", 1) for line in lines)
    assert values["ACCELERATOR_TYPE"] == "'v4-16'"
    assert values["WORKER_ID"] == "'1'"
    assert values["NODE_ID"] == "'trainer'"
    assert values["ZONE"] == "'us-central2-b'"
    assert values["CONSUMER_PROJECT_ID"] == "'proj-a'"
    assert "tpu-env" in get(hosts[1], "instance/attributes/")[1].splitlines()


def test_alt_json_quotes_values_and_etags_name_every_answer(hosts: list[str]) -> None:
    status, body, headers = get(hosts[0], "instance/name?alt=json")
    assert (status, body, headers["Content-Type"]) == (
        200,
        '"t1v-n-0a1b2c3d-w-0"',
        "application/json",
    )
    assert get(hosts[0], "instance/name")[1] == "t1v-n-0a1b2c3d-w-0"
    assert get(hosts[0], "instance/hostname")[1].startswith("t1v-n-0a1b2c3d-w-0.us-central2-b.")
    for path in ("instance/name", "instance/attributes/", "project/project-id", "nothing/here"):
        assert len(get(hosts[0], path)[2]["ETag"]) == 16, path
    same = {get(hosts[0], "instance/name")[2]["ETag"] for _ in range(2)}
    assert len(same) == 1 and same != {get(hosts[1], "instance/name")[2]["ETag"]}


def test_methods_other_than_get_are_405_and_flavor_is_required(hosts: list[str]) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, _, headers = get(hosts[0], "instance/name", method=method)
        assert (status, headers["Allow"]) == (405, "GET"), method
    assert get(hosts[0], "instance/name", flavor=False)[0] == 403
    assert get(hosts[0], "instance/no-such-key")[0] == 404


def test_wait_for_change_returns_on_a_change_or_at_the_timeout(
    hosts: list[str], store: MetadataStore
) -> None:
    path = "instance/attributes/agent-worker-number"
    _, value, headers = get(hosts[0], path)
    stale = get(hosts[0], f"{path}?wait_for_change=true&last_etag=0000000000000000")
    assert stale[1] == value  # a different last_etag: the current value at once
    start = time.monotonic()
    timed_out = get(hosts[0], f"{path}?wait_for_change=true&timeout_sec=1")
    assert timed_out[1] == value and 0.9 < time.monotonic() - start < 5
    changed = {0: {"agent-worker-number": "7"}, 1: {}}
    later = threading.Timer(0.3, store.set_attributes, (changed, store.hostnames))
    later.start()
    etag = headers["ETag"]
    status, body, new_headers = get(hosts[0], f"{path}?wait_for_change=true&last_etag={etag}")
    later.join()
    assert (status, body) == (200, "7") and new_headers["ETag"] != etag
    threading.Timer(0.3, store.set_preempted, (True,)).start()
    assert get(hosts[1], "instance/preempted?wait_for_change=true&timeout_sec=30")[1] == "TRUE"


def test_google_auth_compute_engine_credentials_refresh(hosts: list[str]) -> None:
    """The real google-auth, as a process on a worker runs it (GCE_METADATA_HOST set)."""
    code = (
        "import google.auth, google.auth.compute_engine as ce\n"
        "import google.auth.transport.requests as r\n"
        "from google.auth.compute_engine import _metadata\n"
        "c = ce.Credentials(); c.refresh(r.Request())\n"
        "_, project = google.auth.default()\n"
        "env = _metadata.get(r.Request(), 'instance/attributes/tpu-env')\n"
        "print(c.token, c.service_account_email, project, 'WORKER_ID' in env)\n"
    )
    env = {**os.environ, "GCE_METADATA_HOST": hosts[1], "GCE_METADATA_IP": hosts[1]}
    argv = [sys.executable, "-W", "ignore", "-c", code]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    token, *rest = done.stdout.split()
    assert rest == [ACCOUNT, "proj-a", "True"]
    assert tokens.verify(KEY, token) == (ACCOUNT, "")  # the VM's token names its account
    assert tokens.verify(b"another pod's key" * 2, token)[0] is None
