"""Checks of single stack config values, each raising one ConfigError line that names the key,
says what is wrong and how to fix it. What keys mean together is infra.config's StackConfig."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

NAMESPACE = "tpupod"
PROVISIONING_MODES = ("spot", "preemptible", "on-demand", "reserved")
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_DATA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


class ConfigError(ValueError):
    """One bad key: `str()` is the whole one-line message."""

    def __init__(self, key: str, problem: str):
        self.key = key if ":" in key else f"{NAMESPACE}:{key}"
        super().__init__(f"{self.key}: {problem}")


def check_data_location(value: str) -> str:
    """`tpupod:data`: a name under the stack bucket's data/ prefix, or gs://BUCKET/PATH."""
    value = value.strip().rstrip("/")
    if value.startswith("gs://"):
        bucket, _, path = value[len("gs://") :].partition("/")
        check_bucket_name(bucket, "data")
        ok = bool(path)
    else:
        ok = bool(_DATA_NAME.match(value)) and ".." not in value.split("/")
    if not ok or any(c.isspace() for c in value):
        raise ConfigError(
            "data",
            f"{value!r} is neither a name under the stack bucket's data/ prefix (like "
            "corpus-bpe) nor gs://BUCKET/PATH; prepare data with `python -m trainer.data "
            "prepare --out gs://BUCKET/data/NAME` and name it",
        )
    return value


def check_provisioning(value: Any) -> str:
    """Exactly one provisioning mode (a list such as "spot,reserved" is refused, not guessed)."""
    modes = [m for m in re.split(r"[\s,+]+", str(value).strip().lower()) if m]
    unknown = [m for m in modes if m not in PROVISIONING_MODES]
    if unknown or not modes:
        raise ConfigError(
            "provisioning",
            f"unknown mode {value!r}; use one of {', '.join(PROVISIONING_MODES)}",
        )
    if {"spot", "reserved"} <= set(modes):
        raise ConfigError(
            "provisioning",
            "spot and reserved cannot be combined (spot capacity never comes from a "
            "reservation); set exactly one of them",
        )
    if len(set(modes)) > 1:
        raise ConfigError("provisioning", f"{value!r} names several modes; set exactly one")
    return modes[0]


def check_subnet(value: str) -> str:
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise ConfigError(
            "subnetCidr", f"{value!r} is not a CIDR range like 10.64.0.0/20"
        ) from None
    if not network.is_private:
        raise ConfigError("subnetCidr", f"{value} is not a private range; use e.g. 10.64.0.0/20")
    return value


def check_ssh_cidr(cidr: str) -> None:
    """One listed range on its own; what the list opens together is checked after."""
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise ConfigError(
            "sshSourceRanges", f"{cidr!r} is not a CIDR range; write ranges like 203.0.113.0/24"
        ) from None
    if network.version != 4:
        raise ConfigError(
            "sshSourceRanges", f"{cidr} is IPv6; the workers' VPC is IPv4-only, list IPv4 ranges"
        )
    if str(network) != cidr:
        raise ConfigError("sshSourceRanges", f"{cidr!r} has host bits set; did you mean {network}?")


def check_bucket_name(name: str, key: str = "bucketName") -> None:
    """Cloud Storage naming rules (https://cloud.google.com/storage/docs/buckets#naming)."""
    problem = None
    if not _BUCKET_NAME.match(name) or ".." in name:
        problem = (
            "use 3-63 lowercase letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit"
        )
    elif name.startswith("goog") or "google" in name:
        problem = "names may not start with 'goog' or contain 'google'; pick another name"
    elif re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        problem = "names may not look like an IP address; pick another name"
    if problem:
        raise ConfigError(key, f"{name!r} is not a valid bucket name; {problem}")


CREATE_VIAS = (
    "queued",
    "direct",
)  # how recovery asks for the slice (ops.cloud.tpu, ops.cloud.queued)


def check_zones(zones: tuple[str, ...], zone: str | None, offered: tuple[str, ...],
                generation: str) -> tuple[str, ...]:  # fmt: skip
    """`tpupod:zones`: where recovery may put the slice, in order. Each must offer the TPU, and
    all lie in the stack's one region: the subnet and Cloud NAT the stack declares are regional,
    and a zone outside them would leave the workers with no network (nor a cheap path to the
    bucket). `tpupod:zone`, when set too, must be one of them."""
    zones = tuple(dict.fromkeys(str(z).strip() for z in zones if str(z).strip()))
    if not zones:
        return ()
    for z in zones:
        if z not in offered:
            raise ConfigError("zones", f"{z} does not offer {generation}; use zones of "
                              f"{', '.join(offered)}")  # fmt: skip
    home = zone or zones[0]
    if zone is not None and zone not in zones:
        raise ConfigError("zones", f"tpupod:zone {zone} is not in the list; put it first (it is "
                          "where the slice starts) or remove tpupod:zone")  # fmt: skip
    region = region_of(home)
    for z in zones:
        if region_of(z) != region:
            raise ConfigError("zones", f"{z} is in {region_of(z)}, but the stack's network "
                              f"(subnet, Cloud NAT) is in {region}; list zones of {region} only, "
                              "or deploy another stack in that region")  # fmt: skip
    return zones


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def check_create_via(value: Any) -> str:
    via = str(value).strip().lower()
    if via not in CREATE_VIAS:
        raise ConfigError("createVia", f"{value!r}: use queued (a queued resource, as Google "
                          "recommends) or direct (nodes.create)")  # fmt: skip
    return via
