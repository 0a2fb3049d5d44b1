"""The provider for a target: the API its spec names (ops.cloud.target.Target.api)."""

from __future__ import annotations

from ops.cloud.slice import Provider
from ops.cloud.target import COMPUTE, Target


def provider_for(target: Target) -> Provider:
    """A ComputeProvider for a managed instance group's spec, else a TpuProvider; each imports
    its Google client only when chosen (each takes a second or two)."""
    if target.api == COMPUTE:
        from ops.cloud.compute import ComputeProvider

        return ComputeProvider(target)
    from ops.cloud.tpu import TpuProvider

    return TpuProvider(target)
