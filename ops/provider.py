"""The ops -> provider seam: describe, recreate, delete. GCP and the local pod implement it.

Everything above this interface (Fabric layer, status, watch, demo) is shared by both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class SliceState(StrEnum):
    """TPU API node states (google.cloud.tpu_v2.Node.State), plus MISSING and UNKNOWN."""

    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REPAIRING = "REPAIRING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    DELETING = "DELETING"
    MISSING = "MISSING"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, raw: str | None) -> SliceState:
        if raw is None:
            return cls.MISSING
        try:
            return cls(raw.upper())
        except ValueError:
            return cls.UNKNOWN


@dataclass(frozen=True)
class Worker:
    """How to reach one worker over SSH."""

    index: int
    host: str
    port: int = 22
    user: str | None = None
    key_filename: str | None = None
    # An SSH ProxyCommand (GCP through IAP); None to connect directly.
    proxy_command: str | None = None


@dataclass
class SliceInfo:
    state: SliceState
    health: str | None = None
    workers: list[Worker] = field(default_factory=list)
    detail: str | None = None


class Provider(Protocol):
    """A slice that ops can look at and replace."""

    name: str

    def describe(self) -> SliceInfo: ...

    def recreate(self) -> None:
        """Delete the slice if it exists, then create it again; returns once creation started."""

    def delete(self) -> None: ...


class ProviderError(Exception):
    """A provider cannot act: the message is one line saying what to install or run."""
