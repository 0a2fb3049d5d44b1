"""What ingress opens, measured: the union of source ranges that reach a port (pure Python).

Shared by config validation (`tpupod:sshSourceRanges`) and the policy pack (every ingress rule of
a stack, per port), so "narrow" means one thing in both. The rule: beyond the IAP range and the
VPC's own subnet ranges, the sources that reach any one port may add up to at most a /16 (65,536
addresses) in total, public or private alike. An office /28 or a peered /24 passes;
`0.0.0.0/1 + 128.0.0.0/1`, a /4, a public /8, or 10.0.0.0/8 from outside a 10.64.0.0/20 VPC do not.
Counting addresses (not checking each prefix) is what makes a split range count as what it is.
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.security import IAP_RANGE

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
NARROW_LIMIT = 2**16  # addresses: a /16 in total
ALL_PORTS = (0, 65535)
WHOLE_INTERNET = {ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")}


@dataclass(frozen=True)
class Exposure:
    """Which of the given sources reach beyond IAP and the VPC, and how many addresses that is."""

    reaching: tuple[str, ...]  # the given ranges with addresses outside, as given
    addresses: int
    whole_internet: bool

    @property
    def narrow(self) -> bool:
        return self.addresses <= NARROW_LIMIT


def _collapse(networks: Iterable[Network]) -> list[Network]:
    by_version: dict[int, list[Network]] = {}
    for net in networks:
        by_version.setdefault(net.version, []).append(net)
    return [n for nets in by_version.values() for n in ipaddress.collapse_addresses(nets)]


def _subtract(networks: Iterable[Network], holes: Iterable[Network]) -> list[Network]:
    remaining = _collapse(networks)
    for hole in holes:
        kept: list[Network] = []
        for net in remaining:
            if net.version != hole.version or not net.overlaps(hole):
                kept.append(net)
            elif not net.subnet_of(hole):  # CIDRs overlap only by containment: hole is inside
                kept.extend(net.address_exclude(hole))
        remaining = kept
    return _collapse(remaining)


def measure(sources: Iterable[str], vpc_cidrs: Iterable[str] = ()) -> Exposure:
    """Addresses in `sources` outside the IAP range and `vpc_cidrs`, counted once each."""
    given = [str(s) for s in sources]
    networks = [ipaddress.ip_network(s, strict=False) for s in given]
    inside = [ipaddress.ip_network(IAP_RANGE)] + [ipaddress.ip_network(c) for c in vpc_cidrs]
    outside = _subtract(networks, inside)
    reaching = tuple(s for s, net in zip(given, networks, strict=True) if _subtract([net], inside))
    return Exposure(
        reaching=reaching,
        addresses=sum(n.num_addresses for n in outside),
        whole_internet=bool(WHOLE_INTERNET & set(_collapse(networks))),
    )


def describe(exposure: Exposure, what: str, vpc_cidrs: Iterable[str] = ()) -> str:
    """One line: which ranges, how much they open, the limit, and what to do instead."""
    vpc = ", ".join(vpc_cidrs) or "none declared"
    verb = "opens" if len(exposure.reaching) == 1 else "open"
    amount = f"{exposure.addresses:,} addresses beyond IAP {IAP_RANGE} and the VPC ({vpc})"
    if exposure.whole_internet:
        amount = f"the whole internet ({amount})"
    return (
        f"{', '.join(exposure.reaching)} {verb} {what} to {amount}; ranges outside IAP and the "
        f"VPC may add up to {NARROW_LIMIT:,} addresses (a /16 in total): list narrow ranges "
        "such as your office's /28"
    )


# Firewall rules as the engine sees them (camelCase wire properties).


def _port_ranges(props: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The ports an ingress rule opens; a protocol without ports opens all of them."""
    opened: list[tuple[int, int]] = []
    for allow in props.get("allows") or []:
        ports = allow.get("ports") or []
        if not ports:
            opened.append(ALL_PORTS)
        for spec in ports:
            low, _, high = str(spec).partition("-")
            opened.append((int(low), int(high or low)))
    return opened


def _sources(props: Mapping[str, Any]) -> list[str]:
    ranges = [str(r) for r in props.get("sourceRanges") or []]
    if not ranges and not props.get("sourceTags") and not props.get("sourceServiceAccounts"):
        return ["0.0.0.0/0"]  # GCE's default for an ingress rule without any source
    return ranges


def _opens(props: Mapping[str, Any]) -> bool:
    direction = (props.get("direction") or "INGRESS").upper()
    return direction == "INGRESS" and not props.get("disabled")


def wide_ports(firewalls: Iterable[Mapping[str, Any]], vpc_cidrs: Iterable[str] = ()) -> list[str]:
    """For each run of ports, the union of every ingress rule's sources that reach it; too wide ->
    one line per run."""
    vpc = list(vpc_cidrs)
    rules = [(_sources(p), _port_ranges(p)) for p in firewalls if _opens(p)]
    edges = sorted(
        {lo for _, ports in rules for lo, _ in ports}
        | {hi + 1 for _, ports in rules for _, hi in ports}
    )
    found: list[tuple[int, int, Exposure]] = []
    for low, next_low in itertools.pairwise(edges):
        sources = [
            src for srcs, ports in rules if any(lo <= low <= hi for lo, hi in ports) for src in srcs
        ]
        exposure = measure(sources, vpc) if sources else None
        if exposure is None or exposure.narrow:
            continue
        if found and found[-1][1] == low - 1 and found[-1][2] == exposure:
            found[-1] = (found[-1][0], next_low - 1, exposure)
        else:
            found.append((low, next_low - 1, exposure))
    return [
        describe(e, f"port {lo}" if lo == hi else f"ports {lo}-{hi}", vpc) for lo, hi, e in found
    ]
