"""Firewall sources judged by what they open, in stack config and in the policy pack alike.

Narrow = beyond the IAP range and the VPC's own subnet, at most 65,536 addresses (a /16) in total
per port, public or private. Config cases run the whole program under mocks: a refused list is one
RunError line naming the key and the ranges, and nothing is declared.
"""

from __future__ import annotations

import json

import pulumi
import pytest

from infra import exposure, offline, policies
from infra.security import IAP_RANGE

BASE = "v4-8"
FIREWALL = "gcp:compute/firewall:Firewall"
SUBNET = ("gcp:compute/subnetwork:Subnetwork", {"ipCidrRange": "10.64.0.0/20"})

REFUSED = {
    "split internet": (["0.0.0.0/1", "128.0.0.0/1"], "the whole internet"),
    "a /4": (["64.0.0.0/4"], "268,435,456 addresses"),
    "a public /8": (["8.0.0.0/8"], "16,777,216 addresses"),
    "10/8 from outside the VPC": (["10.0.0.0/8"], "16,773,120 addresses"),
    "two /16s together": (["198.18.0.0/16", "203.0.0.0/16"], "131,072 addresses"),
}


def evaluate_with_ranges(ranges: list[str]) -> offline.Evaluation:
    config = {**offline.stack_config(BASE), "tpupod:sshSourceRanges": json.dumps(ranges)}
    return offline.evaluate(BASE, config, check=False)


@pytest.mark.parametrize("case", REFUSED)
def test_config_refuses_wide_ssh_sources(case):
    ranges, amount = REFUSED[case]
    evaluation = evaluate_with_ranges(ranges)
    message = str(evaluation.error)
    assert isinstance(evaluation.error, pulumi.RunError), evaluation.error
    assert message.startswith(f"tpupod:sshSourceRanges: {', '.join(ranges)} open")
    assert f"SSH to {amount}" in message or f"({amount}" in message
    assert "65,536 addresses (a /16 in total)" in message and "\n" not in message
    assert evaluation.resources == []


def test_the_whole_message_for_the_split_range():
    evaluation = evaluate_with_ranges(["0.0.0.0/1", "128.0.0.0/1"])
    assert str(evaluation.error) == (
        "tpupod:sshSourceRanges: 0.0.0.0/1, 128.0.0.0/1 open SSH to the whole internet "
        f"(4,294,959,104 addresses beyond IAP {IAP_RANGE} and the VPC (10.64.0.0/20)); ranges "
        "outside IAP and the VPC may add up to 65,536 addresses (a /16 in total): list narrow "
        "ranges such as your office's /28"
    )


@pytest.mark.parametrize(
    "ranges",
    [
        ["203.0.113.16/28"],  # an office
        ["203.0.113.16/28", "10.64.0.0/24", IAP_RANGE],  # plus in-VPC and IAP: free
        ["198.51.100.0/24", "10.200.0.0/24"],  # an office and a peered /24
        ["100.64.0.0/16"],  # exactly a /16
    ],
)
def test_config_accepts_narrow_ranges(ranges):
    evaluation = evaluate_with_ranges(ranges)
    assert evaluation.error is None, evaluation.error
    listed = next(r for r in evaluation.of_type(FIREWALL) if r.name == "network-ssh-listed")
    assert listed.inputs["sourceRanges"] == ranges
    resources = [(r.type, r.inputs) for r in evaluation.resources]
    assert policies.stack_violations(resources) == []
    assert not [
        v for r in evaluation.resources for v in policies.violations(r.type, r.inputs, r.protect)
    ]


def test_private_ranges_count_in_full_with_an_existing_network():
    config = {
        **offline.stack_config(BASE),
        "tpupod:existingNetwork": "projects/p/global/networks/shared",
        "tpupod:existingSubnet": "projects/p/regions/us-central2/subnetworks/tpu",
        "tpupod:sshSourceRanges": '["10.64.0.0/15"]',
    }
    evaluation = offline.evaluate(BASE, config, check=False)
    assert "10.64.0.0/15 opens SSH to 131,072 addresses" in str(evaluation.error)
    assert "the VPC (none declared)" in str(evaluation.error)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("::/0", "is IPv6"), ("2001:db8::/64", "is IPv6")],
)
def test_ipv6_is_refused(value, fragment):
    evaluation = evaluate_with_ranges([value])
    assert fragment in str(evaluation.error) and evaluation.resources == []


def rule(ranges, ports=("22",), protocol="tcp"):
    return (
        FIREWALL,
        {
            "direction": "INGRESS",
            "sourceRanges": list(ranges),
            "allows": [{"protocol": protocol, "ports": list(ports)}],
        },
    )


def iap():
    return rule([IAP_RANGE])


PACK_REFUSED = {
    "split across two rules": ([iap(), rule(["0.0.0.0/1"]), rule(["128.0.0.0/1"])], "port 22"),
    "a /4 on port 22": ([iap(), rule(["64.0.0.0/4"])], "port 22"),
    "a public /8 on 8080": ([rule(["8.0.0.0/8"], ["8080"])], "port 8080"),
    "a public /8 on all ports": ([rule(["8.0.0.0/8"], [], "all")], "ports 0-65535"),
    "10/8 on 22 from outside the VPC": ([SUBNET, iap(), rule(["10.0.0.0/8"])], "port 22"),
    "two /16s on overlapping ports": (
        [rule(["198.18.0.0/16"], ["20-30"]), rule(["203.0.0.0/16"], ["22"])],
        "port 22",
    ),
}


@pytest.mark.parametrize("case", PACK_REFUSED)
def test_pack_refuses_wide_ingress(case):
    resources, ports = PACK_REFUSED[case]
    found = policies.stack_violations(resources)
    assert len(found) == 1, found
    assert found[0].startswith("tpupod-narrow-ingress: ") and f" {ports} to " in found[0]


@pytest.mark.parametrize(
    "resources",
    [
        [SUBNET, iap(), rule(["203.0.113.16/28"])],
        [SUBNET, rule(["10.64.0.0/20"], [], "all")],  # the VPC itself, every port
        [rule(["198.18.0.0/16"], ["22"]), rule(["203.0.0.0/16"], ["8080"])],  # per port
        [(FIREWALL, {"sourceTags": ["w"], "allows": [{"protocol": "tcp"}]})],
        [(FIREWALL, {"direction": "EGRESS", "destinationRanges": ["0.0.0.0/0"]})],
    ],
)
def test_pack_accepts_narrow_ingress(resources):
    assert policies.stack_violations(resources) == []


def test_a_rule_without_sources_counts_as_the_internet():
    found = exposure.wide_ports([{"allows": [{"protocol": "tcp", "ports": ["443"]}]}])
    assert len(found) == 1 and "0.0.0.0/0 opens port 443 to the whole internet" in found[0]


@pytest.mark.parametrize(("days", "ok"), [("7", True), ("90", True), ("3", False), ("0", False)])
def test_soft_delete_days(days, ok):
    config = {**offline.stack_config(BASE), "tpupod:softDeleteDays": days}
    evaluation = offline.evaluate(BASE, config, check=False)
    if ok:
        bucket = evaluation.one("gcp:storage/bucket:Bucket")
        assert bucket.inputs["softDeletePolicy"]["retentionDurationSeconds"] == int(days) * 86400
    else:
        assert str(evaluation.error) == (
            f"tpupod:softDeleteDays: {days} is outside Cloud Storage's soft-delete range; "
            "use 7 to 90 days"
        )
        assert evaluation.resources == []
