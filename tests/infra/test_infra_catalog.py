"""The accelerator catalog and the names derived from a stack."""

from __future__ import annotations

import pytest

from infra import catalog
from infra.naming import GCE_NAME, gce_name


@pytest.mark.parametrize(
    ("name", "api_type", "generation", "chips", "hosts", "chips_per_host", "runtime"),
    [
        ("v4-8", "v4-8", "v4", 4, 1, 4, "tpu-ubuntu2204-base"),
        ("v4-32", "v4-32", "v4", 16, 4, 4, "tpu-ubuntu2204-base"),
        ("v5e-8", "v5litepod-8", "v5e", 8, 1, 8, "v2-alpha-tpuv5-lite"),
        ("v5e-16", "v5litepod-16", "v5e", 16, 4, 4, "v2-alpha-tpuv5-lite"),
        ("v5litepod-16", "v5litepod-16", "v5e", 16, 4, 4, "v2-alpha-tpuv5-lite"),
        ("v5p-8", "v5p-8", "v5p", 4, 1, 4, "v2-alpha-tpuv5"),
        ("v5p-16", "v5p-16", "v5p", 8, 2, 4, "v2-alpha-tpuv5"),
        ("v5p-32", "v5p-32", "v5p", 16, 4, 4, "v2-alpha-tpuv5"),
        ("v6e-8", "v6e-8", "v6e", 8, 1, 8, "v2-alpha-tpuv6e"),
        ("v6e-16", "v6e-16", "v6e", 16, 4, 4, "v2-alpha-tpuv6e"),
    ],
)
def test_lookup(name, api_type, generation, chips, hosts, chips_per_host, runtime):
    accelerator = catalog.lookup(name)
    assert accelerator.api_type == api_type
    assert accelerator.generation.name == generation
    assert (accelerator.chips, accelerator.hosts, accelerator.chips_per_host) == (
        chips,
        hosts,
        chips_per_host,
    )
    assert accelerator.default_runtime_version == runtime
    assert accelerator.zones


@pytest.mark.parametrize("bad", ["v9-8", "v4", "tpu", "v4-12", "v5e-2", "v6e-512", ""])
def test_unknown_types_are_refused(bad):
    with pytest.raises(catalog.CatalogError):
        catalog.lookup(bad)


@pytest.mark.parametrize(
    ("runtime", "generation"),
    [
        ("v2-alpha-tpuv5-lite", "v5e"),
        ("v2-alpha-tpuv5", "v5p"),
        ("v2-alpha-tpuv6e", "v6e"),
        ("tpu-ubuntu2204-base", "v4"),
        ("some-custom-image", None),
    ],
)
def test_runtime_generation(runtime, generation):
    assert catalog.generation_of_runtime(runtime) == generation


def test_every_generation_is_consistent():
    for generation in catalog.GENERATIONS.values():
        assert generation.apis  # some API makes it
        if generation.tpu_api:  # a TPU API runtime names it
            assert catalog.generation_of_runtime(generation.runtime_version) == generation.name
        for size in generation.sizes:
            accelerator = catalog.lookup(f"{generation.name}-{size}")
            assert accelerator.hosts * accelerator.chips_per_host == accelerator.chips


@pytest.mark.parametrize(
    "parts", [("tpupod", "v4-32"), ("My Project", "tpupod", "x" * 80), ("123",), ("a_b", "C")]
)
def test_gce_names_are_valid(parts):
    name = gce_name(*parts)
    assert GCE_NAME.match(name) and len(name) <= 63


@pytest.mark.parametrize(
    ("accelerator", "spot", "scope", "name"),
    [  # each as Google's 429s name it (captured in public logs; infra.catalog says so)
        ("v6e-8", True, "zone", "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI"),
        ("v6e-8", False, "region", "TPUV6EPerProjectPerRegionForTPUAPI"),
        ("v4-32", True, "region", "TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI"),
        ("v5e-16", False, "zone", "TPUV5sLitepodPerProjectPerZoneForTPUAPI"),
        ("v5e-16", True, "zone", "TPUV5sPreemptibleLitepodPerProjectPerZoneForTPUAPI"),
        ("v5p-8", True, "zone", "TPUV5PPreemptiblePerProjectPerZoneForTPUAPI"),
        ("v5p-8", False, "region", "TPUV5PPerProjectPerRegionForTPUAPI"),
    ],
)
def test_quota_names_are_googles(accelerator, spot, scope, name):
    template = catalog.lookup(accelerator).generation.quota
    assert catalog.quota_metric(template, spot, scope) == name


def test_a_quota_scope_is_a_region_or_a_zone():
    with pytest.raises(ValueError, match="region, zone"):
        catalog.quota_metric("TPUV6E{spot}", True, "project")
