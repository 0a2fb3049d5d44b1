"""`tpupod:api`: which Google API makes the slice, and the stack keys that only one of them has.

The Cloud TPU API (`tpu`) makes v4, v5e, v5p and v6e slices as one `Node`, with queued
resources and TPU runtimes; Compute Engine (`compute`) makes v5p, v6e and TPU7x multi-host
slices as a managed instance group under a workload policy, booting an image family (catalog).
A combination Google does not offer is one line naming the key, never a guess.
"""

from __future__ import annotations

from typing import Any

from infra import catalog
from infra.config_checks import ConfigError

WHY = {
    catalog.TPU_API: "the Cloud TPU API",
    catalog.COMPUTE: "Compute Engine",
}
# What Compute Engine's instance template says for each of tpupod's provisioning modes
# (`scheduling.provisioningModel`; SPOT also wants preemptible and no automatic restart).
COMPUTE_PROVISIONING = {"spot": "SPOT", "on-demand": "STANDARD", "reserved": "RESERVATION_BOUND"}


def check_api(value: Any) -> str:
    api = str(value).strip().lower()
    if api not in catalog.APIS:
        raise ConfigError("api", f"{value!r}: use tpu (the Cloud TPU API) or compute (Compute "
                          "Engine: a managed instance group under a workload policy)")  # fmt: skip
    return api


def check_api_offered(api: str | None, accelerator: catalog.Accelerator, given: set[str],
                      config: Any) -> None:  # fmt: skip
    """`api` (None: the default) makes `accelerator`, and no key `given` belongs to the other
    API alone. `config` is the StackConfig being checked (its createVia, runtimeVersion, ...)."""
    generation = accelerator.generation
    if api is not None and api not in accelerator.apis:
        if api not in generation.apis:
            others = [g.name for g in catalog.GENERATIONS.values() if api in g.apis]
            raise ConfigError("api", f"{WHY[api]} does not make {generation.name} slices (it "
                              f"makes {', '.join(others)}); use tpupod:api: "
                              f"{accelerator.default_api} or remove the key")  # fmt: skip
        sizes = [f"{generation.name}-{n}" for n in generation.sizes
                 if api in catalog.lookup(f"{generation.name}-{n}").apis]  # fmt: skip
        raise ConfigError("api", f"{accelerator.name} is one VM; tpupod declares multi-host "
                          f"slices through {WHY[api]} ({', '.join(sizes)}); use tpupod:api: "
                          f"{accelerator.default_api} or another size")  # fmt: skip
    if (api or accelerator.default_api) != catalog.COMPUTE:
        return
    offer = generation.compute
    if "create_via" in given and config.create_via == "queued":
        raise ConfigError("createVia", "queued resources exist only on the Cloud TPU API; on "
                          "Compute Engine the managed instance group asks for every VM at once "
                          "(BULK); remove the key or set tpupod:api: tpu")  # fmt: skip
    if config.queue_valid_hours is not None:
        raise ConfigError("queueValidHours", "a queued resource's lifetime, and queued "
                          "resources exist only on the Cloud TPU API; remove the key")  # fmt: skip
    if config.runtime_version is not None:
        raise ConfigError("runtimeVersion", f"names a Cloud TPU API runtime, but this slice "
                          f"comes from Compute Engine, which boots {offer.image}; remove the "
                          "key")  # fmt: skip
    if config.provisioning not in COMPUTE_PROVISIONING:
        raise ConfigError("provisioning", f"{config.provisioning} is the Cloud TPU API's "
                          f"older tier; on Compute Engine use one of "
                          f"{', '.join(COMPUTE_PROVISIONING)}")  # fmt: skip
