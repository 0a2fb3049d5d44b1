"""A 2-worker local pod for the module, booting a tiny stand-in script (not bootstrap/startup.sh),
and Google's own TPU client pointed at the pod's Cloud TPU API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import tpu_v2
from google.oauth2.credentials import Credentials

from localpod.gcp import identities
from localpod.pod import LocalPod

STARTUP_SCRIPT = r"""#!/bin/bash
set -euo pipefail
mkdir -p "$TPUPOD_ROOT"
curl -sf -H 'Metadata-Flavor: Google' \
  "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/agent-worker-number" \
  > "$TPUPOD_ROOT/booted"
"""


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPod]:
    """A READY 2-worker pod for the module; down() runs whatever happens in the tests."""
    script = tmp_path_factory.mktemp("script") / "startup.sh"
    script.write_text(STARTUP_SCRIPT)
    local_pod = LocalPod(tmp_path_factory.mktemp("pod"), workers=2, startup_script=script)
    try:
        local_pod.up()
        yield local_pod
    finally:
        local_pod.down()


@pytest.fixture(scope="module")
def endpoints(pod: LocalPod) -> dict:
    return pod.endpoints()


@pytest.fixture(scope="module")
def tpu(endpoints: dict) -> tpu_v2.TpuClient:
    """Exactly Contract 3's client: REST, the operator's token, the pod's endpoint."""
    return tpu_v2.TpuClient(
        transport="rest",
        credentials=Credentials(token=identities.operator_token(endpoints)),
        client_options={"api_endpoint": endpoints["tpu_api"].rstrip("/")},
    )


@pytest.fixture(scope="module")
def parent(endpoints: dict) -> str:
    return f"projects/{endpoints['project']}/locations/{endpoints['zone']}"


@pytest.fixture(scope="module")
def spec(endpoints: dict) -> dict:
    """The node spec `up` created the node from (Contract 2)."""
    return json.loads(Path(endpoints["spec_file"]).read_text())
