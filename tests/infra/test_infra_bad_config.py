"""Bad stack config: one clear RunError line (key, problem, fix) and not a single resource.

Each case runs the whole program under mocks with one key spoiled, so the check is the real
path (`__main__.py` -> `infra.config.load`), not the validator alone.
"""

from __future__ import annotations

import pulumi
import pytest

from infra import offline
from infra.tpu_slice import check_metadata_size

BASE = "v4-8"

CASES = {
    "unknown accelerator type": (
        {"tpupod:acceleratorType": "v9-8"},
        "tpupod:acceleratorType: unknown accelerator type 'v9-8'; use one of v4-N, v5e-N, v5p-N, v6e-N, tpu7x-N",
    ),
    "chip count not in generation": (
        {"tpupod:acceleratorType": "v5e-12"},
        "tpupod:acceleratorType: v5e-12 is not a v5e slice size; use one of v5e-1, v5e-4, "
        "v5e-8, v5e-16, v5e-32, v5e-64, v5e-128, v5e-256",
    ),
    "runtime of another generation": (
        {"tpupod:runtimeVersion": "v2-alpha-tpuv6e"},
        "tpupod:runtimeVersion: v2-alpha-tpuv6e is a v6e runtime but v4-8 is v4; use "
        "tpu-ubuntu2204-base or remove the key",
    ),
    "zone without the generation": (
        {"tpupod:zone": "us-west4-a"},
        "tpupod:zone: us-west4-a does not offer v4; use one of us-central2-b",
    ),
    "missing gcp:project": (
        {"gcp:project": None},
        "gcp:project: not set; run `pulumi config set gcp:project YOUR_PROJECT_ID`",
    ),
    "unknown provisioning mode": (
        {"tpupod:provisioning": "cheap"},
        "tpupod:provisioning: unknown mode 'cheap'; use one of spot, preemptible, on-demand, "
        "reserved",
    ),
    "spot and reserved together": (
        {"tpupod:provisioning": "spot,reserved"},
        "tpupod:provisioning: spot and reserved cannot be combined (spot capacity never comes "
        "from a reservation); set exactly one of them",
    ),
    "malformed SSH CIDR": (
        {"tpupod:sshSourceRanges": '["203.0.113.0/24", "10.0.0.300/24"]'},
        "tpupod:sshSourceRanges: '10.0.0.300/24' is not a CIDR range; write ranges like "
        "203.0.113.0/24",
    ),
    "invalid bucket name": (
        {"tpupod:bucketName": "My_Checkpoints"},
        "tpupod:bucketName: 'My_Checkpoints' is not a valid bucket name; use 3-63 lowercase "
        "letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
    ),
}


def spoiled(changes: dict[str, str | None]) -> dict[str, str]:
    config = {**offline.stack_config(BASE), **changes}
    return {k: v for k, v in config.items() if v is not None}


@pytest.mark.parametrize("kind", CASES)
def test_bad_config_is_one_line_and_declares_nothing(kind):
    changes, message = CASES[kind]
    evaluation = offline.evaluate(BASE, spoiled(changes), check=False)
    assert isinstance(evaluation.error, pulumi.RunError), evaluation.error
    assert str(evaluation.error) == message
    assert "\n" not in str(evaluation.error)
    assert evaluation.resources == []


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"tpupod:sshSourceRanges": '["0.0.0.0/0"]'}, "opens SSH to the whole internet"),
        ({"tpupod:sshSourceRanges": '["10.0.0.1/24"]'}, "did you mean 10.0.0.0/24?"),
        ({"tpupod:acceleratorTyp": "v4-8"}, "tpupod:acceleratorTyp: unknown key"),
        ({"tpupod:preset": "7b"}, "tpupod:preset: unknown preset '7b'"),
        ({"tpupod:provisioning": "spot preemptible"}, "names several modes"),
        ({"tpupod:existingNetwork": "shared"}, "tpupod:existingSubnet: existingNetwork and"),
        ({"tpupod:bucketName": "google-ckpt"}, "may not start with 'goog' or contain 'google'"),
        ({"tpupod:zones": '["us-central2-b", "us-central1-a"]'}, "us-central1-a does not offer v4"),
        ({"tpupod:zones": '["us-central2-a"]'}, "tpupod:zones: us-central2-a does not offer v4"),
        ({"tpupod:createVia": "queue"}, "tpupod:createVia: 'queue': use queued"),
        ({"tpupod:reservation": "r1"}, "tpupod:reservation: names a reservation, but"),
    ],
)
def test_more_bad_config(changes, fragment):
    evaluation = offline.evaluate(BASE, spoiled(changes), check=False)
    assert isinstance(evaluation.error, pulumi.RunError)
    assert fragment in str(evaluation.error) and "\n" not in str(evaluation.error)
    assert evaluation.resources == []


def test_metadata_over_the_limit_is_refused():
    with pytest.raises(pulumi.RunError, match="over the 524288-byte GCE limit.*'startup-script'"):
        check_metadata_size({"startup-script": "x" * (512 * 1024), "tpupod-stack": "s"})


def test_real_metadata_is_far_below_the_limit(evaluations):
    for evaluation in evaluations.values():
        slice_ = evaluation.of_type("gcp:tpu/v2Vm:V2Vm") or evaluation.of_type(
            "gcp:compute/instanceTemplate:InstanceTemplate"
        )
        metadata = slice_[0].inputs["metadata"]
        assert sum(len(k) + len(v.encode()) for k, v in metadata.items()) < 64 * 1024


def test_recovery_zones_stay_in_the_stack_region_and_reach_the_node_spec():
    """tpupod:zones: a zone of another region is refused in one line (the subnet and NAT are
    regional); zones of the one region reach the exported node spec's `capacity`, queued by
    default, as ops.cloud.target reads it."""
    from infra.config import parse

    base = {"gcp:project": "p", "acceleratorType": "v6e-8"}
    with pytest.raises(ValueError, match=r"tpupod:zones: us-east1-d is in us-east1, but the "
                       r"stack's network \(subnet, Cloud NAT\) is in us-east5"):  # fmt: skip
        parse({**base, "zones": ["us-east5-a", "us-east1-d"]}, stack="s")
    with pytest.raises(ValueError, match="tpupod:zone us-east5-b is not in the list"):
        parse({**base, "zones": ["us-east5-a"], "zone": "us-east5-b"}, stack="s")
    config = parse({**base, "zones": "us-east5-b, us-east5-a", "queueValidHours": "2"}, stack="s")
    assert config.resolved_zone == "us-east5-b"
    assert config.capacity == {"via": "queued", "zones": ["us-east5-b", "us-east5-a"],
                               "valid_for_s": 7200.0, "reservation": None}  # fmt: skip
    assert parse(base, stack="s").capacity["zones"] == ["us-central1-b"]
