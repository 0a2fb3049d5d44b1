"""What ops knows about a slice: the TPU node's state and how to reach each worker.

`ops.cloud.tpu.TpuProvider` (the only provider) fills these from the Cloud TPU API, on GCP and against
the local pod's copy of that API alike; everything above it (Fabric layer, status, watch, demo)
reads only these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
