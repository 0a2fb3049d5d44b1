"""Accelerator catalog: what a TPU accelerator type means for the slice we declare.

Facts only, each with the Google Cloud page it comes from. The stack config names a type such as
`v4-32` or `v5e-16`; everything else (hosts, API string, runtime, zones) is looked up here so a
stack file stays short and a wrong combination is caught before any resource is declared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Multi-host slices of every generation here run 4 chips per TPU VM: v4 and v5p machines hold 4
# chips; v5e and v6e slices above 8 chips are built from 4-chip VMs (ct5lp-hightpu-4t,
# ct6e-standard-4t), while 1-, 4- and 8-chip slices are a single VM.
#   https://cloud.google.com/tpu/docs/v4                (4 chips per host, 2 TensorCores per chip)
#   https://cloud.google.com/tpu/docs/v5p               (topology table: cores, chips, hosts)
#   https://cloud.google.com/tpu/docs/v5e               ("each TPU VM ... contains 1, 4 or 8 chips")
#   https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus (single- vs multi-host)
MULTI_HOST_CHIPS_PER_HOST = 4


# The two ways Google makes a slice: the Cloud TPU API (a `Node`, gcp.tpu.V2Vm) and Compute
# Engine (a managed instance group of TPU VMs under a workload policy). Google's TPU docs: "The
# Cloud TPU API is no longer under active development ... New hardware generations starting
# with TPU7x (Ironwood) are supported only through Compute Engine or GKE"
# (https://docs.cloud.google.com/tpu/docs/tpus-in-compute-engine); Compute Engine offers TPU7x,
# v6e and v5p, not v5e or v4 (https://docs.cloud.google.com/compute/docs/tpus/tpu-machines).
TPU_API, COMPUTE = "tpu", "compute"
APIS = (TPU_API, COMPUTE)


@dataclass(frozen=True)
class ComputeOffer:
    """How Compute Engine offers a generation's multi-host slices: one 4-chip machine type per
    VM, the boot image family, and per slice size (chips) the topology the workload policy
    names (`workloadPolicy.acceleratorTopology`)."""

    machine_type: str
    image: str  # projects/P/global/images/family/F: the boot disk's source image
    topologies: dict[int, str]  # chips -> topology, the multi-host sizes offered
    zones: tuple[str, ...]


@dataclass(frozen=True)
class Generation:
    """One TPU generation and how its accelerator type strings are built."""

    name: str  # what users write: v4, v5e, v5p, v6e
    api_prefix: str  # what the TPU API wants before `-N`
    cores_per_chip: int  # N counts TensorCores for v4/v5p (2 per chip), chips for v5e/v6e
    sizes: tuple[int, ...]  # valid N
    single_host_max_chips: int  # largest slice that is one VM
    runtime_version: str
    zones: tuple[str, ...]
    secure_boot: bool  # the node is declared with shieldedInstanceConfig.enableSecureBoot
    quota: str  # the TPU API's quota name before PerProject..., `{spot}` where spot says so
    tpu_api: bool = True  # the Cloud TPU API makes it (TPU7x: no)
    compute: ComputeOffer | None = None  # Compute Engine makes it (v4, v5e: no)

    @property
    def apis(self) -> tuple[str, ...]:
        return tuple(api for api, offered in ((TPU_API, self.tpu_api),
                                              (COMPUTE, self.compute is not None)) if offered)  # fmt: skip


# Runtime versions: https://cloud.google.com/tpu/docs/runtimes ("PyTorch and JAX" table:
#   v6e v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5e v2-alpha-tpuv5-lite, v4 tpu-ubuntu2204-base).
# Zones: https://cloud.google.com/tpu/docs/regions-zones (only zones read there are listed; add
#   others here after checking that page).
# Sizes: v4 https://cloud.google.com/tpu/docs/v4 and /tpu/docs/types-topologies (TensorCore-named,
#   power-of-two slices); v5p https://cloud.google.com/tpu/docs/v5p (topology table, in cores);
#   v5e https://cloud.google.com/tpu/docs/v5e (1x1 .. 16x16); v6e https://cloud.google.com/tpu/docs/v6e
#   (256-chip pod, same 2D shapes as v5e).
# Compute Engine (https://docs.cloud.google.com/compute/docs/tpus/tpu-machines): TPU7x, v6e and
# v5p, 4-chip machine types for multi-host slices; the topology string ("4x4", "2x2x2") must
# match the workload policy's. v6e: "The 8-chip (2x4) configuration attached to 2 VMs is only
# supported when using the GKE API" (tpu/docs/v6e), so its smallest slice here is 4x4 on 4 VMs.
# Boot images: the project ubuntu-os-accelerator-images is Google's (tpu/docs/consume-reservation-
# compute); the family names were read in third-party code (SkyPilot's defaults), not on Google's
# tpu-os-images page: check them there before a first `pulumi up`. TPU7x zones: the Cloud TPU
# zones page. Sizes beyond those listed exist; add them after checking.
ACCEL_IMAGES = "projects/ubuntu-os-accelerator-images/global/images/family"
CUBE_TOPOLOGIES = {8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8"}
TPU7X_ZONES = ("us-central1-c", "us-central1-ai1a")

GENERATIONS: dict[str, Generation] = {
    "v4": Generation(
        name="v4",
        api_prefix="v4",
        cores_per_chip=2,
        sizes=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
        single_host_max_chips=4,
        runtime_version="tpu-ubuntu2204-base",
        zones=("us-central2-b",),
        secure_boot=True,
        quota="TPUV4s{spot}Pod",
    ),
    "v5e": Generation(
        name="v5e",
        api_prefix="v5litepod",
        cores_per_chip=1,
        sizes=(1, 4, 8, 16, 32, 64, 128, 256),
        single_host_max_chips=8,
        runtime_version="v2-alpha-tpuv5-lite",
        zones=("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
        secure_boot=True,
        quota="TPUV5s{spot}Litepod",
    ),
    "v5p": Generation(
        name="v5p",
        api_prefix="v5p",
        cores_per_chip=2,
        # 32: the page's own AcceleratorType example, "v5p-32 ... 32 TensorCores (16 chips)"
        sizes=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288),
        single_host_max_chips=4,
        runtime_version="v2-alpha-tpuv5",
        zones=("us-central1-a", "us-east5-a"),
        secure_boot=True,
        quota="TPUV5P{spot}",
        compute=ComputeOffer(
            machine_type="ct5p-hightpu-4t",
            image=f"{ACCEL_IMAGES}/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
            topologies=CUBE_TOPOLOGIES,
            zones=("us-central1-a", "us-east5-a"),
        ),
    ),
    "v6e": Generation(
        name="v6e",
        api_prefix="v6e",
        cores_per_chip=1,
        sizes=(1, 4, 8, 16, 32, 64, 128, 256),
        single_host_max_chips=8,
        runtime_version="v2-alpha-tpuv6e",
        zones=("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
        secure_boot=True,
        quota="TPUV6E{spot}",
        compute=ComputeOffer(
            machine_type="ct6e-standard-4t",
            image=f"{ACCEL_IMAGES}/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
            # 2x4 on two 4-chip VMs is GKE's alone; on Compute Engine the 8-chip slice is one VM.
            topologies={16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"},
            zones=("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
        ),
    ),
    "tpu7x": Generation(
        name="tpu7x",
        api_prefix="tpu7x",
        cores_per_chip=2,  # tpu7x-16 is 2x2x2: 8 chips on two VMs
        sizes=(16, 32, 64, 128, 256, 512),  # the multi-host ones (a one-VM tpu7x-8 is not here)
        single_host_max_chips=4,
        runtime_version="",  # no Cloud TPU API runtime: Compute Engine boots `compute.image`
        zones=TPU7X_ZONES,
        secure_boot=True,
        quota="",  # the Cloud TPU API's quotas do not apply (tpu_api=False)
        tpu_api=False,
        compute=ComputeOffer(
            machine_type="tpu7x-standard-4t",
            image=f"{ACCEL_IMAGES}/ubuntu-accel-2404-amd64-tpu-tpu7x",
            topologies=CUBE_TOPOLOGIES,
            zones=TPU7X_ZONES,
        ),
    ),
}

# Secure boot: `node.shieldedInstanceConfig.enableSecureBoot` (gcloud `tpu-vm create
# --shielded-secure-boot`, command_lib/compute/tpus/tpu_vm/flags.yaml: "implicitly makes them
# Shielded VM instances"). The v2 API reference (google.cloud.tpu_v2 ShieldedInstanceConfig) names
# no generation limit, and the Terraform provider's acceptance example
# (GoogleCloudPlatform/magic-modules mmv1/templates/terraform/examples/tpu_v2_vm_full.tf.tmpl)
# creates a TPU v2 node, older than any generation here, with it on. So it is on for every
# generation; a generation found to refuse it gets `secure_boot=False` and the rule follows.
# Quota: the TPU API keeps one quota per generation and tier (spot is "Preemptible"), per region
# and per zone (https://cloud.google.com/tpu/docs/quota); a create over either is refused with
# HTTP 429 naming it. The names are Google's as its 429s spell them (the docs page has no list):
# TPUV6EPreemptiblePerProjectPerZoneForTPUAPI, TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI,
# TPUV5sLitepodPerProjectPerZoneForTPUAPI, TPUV5PPerProjectPerRegionForTPUAPI and their
# siblings, all seen in public logs; v4's on-demand name (TPUV4sPod...) only follows that pattern
# (TPUV2sPod... is v2's). v5e's 1-, 4- and 8-chip serving quota (...LitepodServing...) is left out.
QUOTA_SCOPES = ("region", "zone")


# What users may write before `-N`, mapped to a generation (v5e is `v5litepod-N` in the API).
PREFIX_TO_GENERATION: dict[str, str] = {
    "v4": "v4",
    "v5e": "v5e",
    "v5litepod": "v5e",
    "v5p": "v5p",
    "v6e": "v6e",
    "tpu7x": "tpu7x",
}

_TYPE_PATTERN = re.compile(r"^(?P<prefix>[a-z0-9]+)-(?P<size>\d+)$")


class CatalogError(ValueError):
    """A type the catalog does not know; the message says what would be valid."""


@dataclass(frozen=True)
class Accelerator:
    """One slice shape, resolved."""

    name: str  # canonical user-facing name, e.g. v5e-16
    generation: Generation
    size: int
    chips: int
    hosts: int
    chips_per_host: int

    @property
    def api_type(self) -> str:
        return f"{self.generation.api_prefix}-{self.size}"

    @property
    def default_runtime_version(self) -> str:
        return self.generation.runtime_version

    @property
    def zones(self) -> tuple[str, ...]:
        return self.generation.zones

    @property
    def apis(self) -> tuple[str, ...]:
        """The APIs that make this slice: Compute Engine only for the sizes it lists."""
        offer = self.generation.compute
        on_compute = offer is not None and self.chips in offer.topologies
        return tuple(a for a in self.generation.apis if a != COMPUTE or on_compute)

    @property
    def default_api(self) -> str:
        """The TPU API where it makes the slice (today's path, queued resources included),
        else Compute Engine."""
        return TPU_API if TPU_API in self.apis else COMPUTE

    @property
    def topology(self) -> str | None:
        """The workload policy's acceleratorTopology on Compute Engine; None where it is not
        offered there."""
        offer = self.generation.compute
        return offer.topologies.get(self.chips) if offer and COMPUTE in self.apis else None

    def zones_on(self, api: str) -> tuple[str, ...]:
        offer = self.generation.compute
        return offer.zones if api == COMPUTE and offer else self.generation.zones


def lookup(accelerator_type: str) -> Accelerator:
    """Resolve `v4-32`, `v5e-16` or `v5litepod-16`; CatalogError names the valid choices."""
    match = _TYPE_PATTERN.match(accelerator_type.strip().lower())
    generation_name = PREFIX_TO_GENERATION.get(match["prefix"]) if match else None
    if match is None or generation_name is None:
        known = ", ".join(f"{g.name}-N" for g in GENERATIONS.values())
        raise CatalogError(f"unknown accelerator type {accelerator_type!r}; use one of {known}")
    generation = GENERATIONS[generation_name]
    size = int(match["size"])
    if size not in generation.sizes:
        valid = ", ".join(f"{generation.name}-{n}" for n in generation.sizes)
        raise CatalogError(
            f"{accelerator_type} is not a {generation.name} slice size; use one of {valid}"
        )
    chips = max(1, size // generation.cores_per_chip)
    single_host = chips <= generation.single_host_max_chips
    chips_per_host = chips if single_host else MULTI_HOST_CHIPS_PER_HOST
    return Accelerator(
        name=f"{generation.name}-{size}",
        generation=generation,
        size=size,
        chips=chips,
        hosts=chips // chips_per_host,
        chips_per_host=chips_per_host,
    )


# Runtime image families by generation, most specific prefix first (same runtimes page as above).
RUNTIME_PREFIXES: tuple[tuple[str, str], ...] = (
    ("v2-alpha-tpuv5-lite", "v5e"),
    ("v2-alpha-tpuv5", "v5p"),
    ("v2-alpha-tpuv6e", "v6e"),
    ("tpu-ubuntu2204-", "v4"),
    ("tpu-vm-v4-", "v4"),
)


def generation_of_runtime(runtime_version: str) -> str | None:
    """The generation a runtime image is built for; None for images the catalog cannot place."""
    return next((g for p, g in RUNTIME_PREFIXES if runtime_version.startswith(p)), None)


def quota_metric(template: str, spot: bool, scope: str) -> str:
    """The quota a slice counts against: `template` is a Generation's `quota` (or the local
    pod's own), `scope` one of QUOTA_SCOPES, e.g. TPUV6EPreemptiblePerProjectPerRegionForTPUAPI."""
    if scope not in QUOTA_SCOPES:
        raise ValueError(f"quota scope {scope!r}: one of {', '.join(QUOTA_SCOPES)}")
    return (
        template.format(spot="Preemptible" if spot else "")
        + f"PerProjectPer{scope.title()}ForTPUAPI"
    )
