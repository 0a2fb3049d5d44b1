"""What ops knows about a slice: its state and how to reach each worker, and the provider seam.

Two providers fill these: `ops.cloud.tpu.TpuProvider` from the Cloud TPU API (a node) and
`ops.cloud.compute.ComputeProvider` from Compute Engine (a managed instance group), on GCP and
against the local pod's copies of those APIs alike; everything above them (Fabric layer, status,
watch, demo) reads only these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from contract.metadata import BUNDLE_SHA256
from contract.node_state import SliceState  # noqa: F401 - re-exported for ops


@dataclass(frozen=True)
class Worker:
    """How to reach one worker over SSH, all of it from the live node.

    `host` is what paramiko connects to (and looks the host key up under): the guest-attribute
    instance name behind an IAP ProxyCommand, or the internal IP when connecting directly.
    """

    index: int
    host: str
    port: int = 22
    user: str | None = None
    key_filename: str | None = None
    proxy_command: str | None = None  # an SSH ProxyCommand (IAP); None to connect directly
    instance: str | None = None  # guest attribute `hostname` (t1v-n-<id>-w-<i>)
    host_key: str | None = None  # base64 ssh-ed25519 public key from guest attributes
    internal_ip: str | None = None


@dataclass
class SliceInfo:
    state: SliceState
    health: str | None = None
    workers: list[Worker] = field(default_factory=list)
    detail: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)  # the live node's (pulumi up patches it)
    spot: bool = True  # schedulingConfig spot or preemptible: maintenance ends it, never resumes
    zone: str | None = None  # where the node is (one of tpupod:zones)

    @property
    def bundle(self) -> str | None:
        """The code bundle the node's metadata names now (what every worker should run)."""
        return self.metadata.get(BUNDLE_SHA256)


class ProviderError(Exception):
    """The TPU API cannot be used: the message is one line saying what to fix."""


class ZoneCursor:
    """Where a provider's slice is now: one of tpupod:zones (`zones`), moved on by recovery."""

    zone: str
    zones: list[str]

    def move_to(self, zone: str) -> None:
        if zone not in self.zones:
            raise ProviderError(f"zone {zone} is not one of tpupod:zones ({', '.join(self.zones)})")
        self.zone = zone

    def next_zone(self) -> str:
        """The zone after this one in tpupod:zones (round and round)."""
        return self.zones[(self.zones.index(self.zone) + 1) % len(self.zones)]


class Provider(Protocol):
    """The seam recovery and the commands drive: one per API (ops.cloud.providers.provider_for).
    Reads return SliceInfo; writes return a long-running operation's name at once (None: nothing
    to do), which `operation` polls; queued resources exist on the TPU API only."""

    target: Any
    name: str
    zone: str
    zones: list[str]
    queued: bool
    capacity: dict

    def describe(self) -> SliceInfo: ...
    def refresh_spec(self) -> list[str]: ...
    def operation(self, name: str) -> Any: ...
    def request_status(self, zone: str | None = None) -> Any: ...
    def abandon_request(self, zone: str | None = None) -> bool: ...
    def start_delete(self) -> str | None: ...
    def start_create(self, attempt: int | None = None) -> str | None: ...
    def recreate(self, timeout: float = 600.0, poll: float = 0.5) -> Any: ...
    def move_to(self, zone: str) -> None: ...
    def next_zone(self) -> str: ...
    def owned(self) -> list: ...
