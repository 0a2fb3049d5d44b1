"""A LocalPod's slice through Compute Engine (`tpupod local up --api compute`): the spec `up`
writes, built by the Pulumi program's own declaration (infra.mig_spec), and its create / delete
through the pod's Compute Engine API.

The pod's workers play a TPU7x slice: 4 chips per VM, so 2 workers are `tpu7x-16` (2x2x2) and 4
are `tpu7x-32` (2x2x4). TPU7x because Compute Engine makes it alone, and because a v6e slice of
two VMs (2x4) is GKE's only (infra.catalog)."""

from __future__ import annotations

from infra import catalog, mig_spec
from localpod.gcp import compute_client
from localpod.state import PodError

GENERATION = "tpu7x"
NETWORK_TAG = "tpupod-worker"


def accelerator_for(workers: int) -> catalog.Accelerator:
    generation = catalog.GENERATIONS[GENERATION]
    chips = workers * catalog.MULTI_HOST_CHIPS_PER_HOST
    name = f"{GENERATION}-{chips * generation.cores_per_chip}"
    try:
        accelerator = catalog.lookup(name)
    except catalog.CatalogError:
        accelerator = None
    if accelerator is None or accelerator.topology is None:
        offered = sorted(s // generation.cores_per_chip // 4 for s in generation.sizes)
        raise PodError(f"--api compute: {workers} workers is not a {GENERATION} slice Compute "
                       f"Engine makes (workers: {', '.join(map(str, offered))})")  # fmt: skip
    return accelerator


def compute_spec(*, endpoints: dict, node_metadata: dict[str, str], workers: int, spot: bool,
                 labels: dict[str, str], account: str, zones: list[str]) -> dict:  # fmt: skip
    """The stack's `node_spec` on the Compute Engine path, for the pod's group (named as the
    pod's node) in the pod's zone."""
    project, zone = endpoints["project"], endpoints["zone"]
    region = zone.rsplit("-", 1)[0]
    declaration = mig_spec.declare(
        name=endpoints["node"], project=project, zone=zone, accelerator=accelerator_for(workers),
        provisioning="spot" if spot else "on-demand", reservation=None, network_tag=NETWORK_TAG,
        worker_metadata=node_metadata, labels=labels,
    )  # fmt: skip
    return mig_spec.mig_spec(
        declaration,
        network=f"projects/{project}/global/networks/tpupod",
        subnetwork=f"projects/{project}/regions/{region}/subnetworks/tpupod",
        service_account_email=account,
        capacity={"via": "direct", "zones": list(zones)},
    )


def create(endpoints: dict, spec: dict, timeout: float | None) -> None:
    compute_client.create_mig(endpoints, spec, timeout)


def delete(endpoints: dict, spec: dict, timeout: float | None) -> None:
    if not compute_client.delete_mig(endpoints, spec, timeout):
        raise PodError(f"cannot delete: there is no group {spec['manager']['name']}")
