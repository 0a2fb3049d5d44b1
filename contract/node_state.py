"""The Cloud TPU node states: one definition, for ops (which reads them from the API) and the local
pod (which plays them). Pure Python, a leaf: it imports nothing of tpupod.
"""

from __future__ import annotations

from enum import StrEnum


class SliceState(StrEnum):
    """google.cloud.tpu_v2.Node.State names, plus MISSING (no node: never a Node's state) and
    UNRECOGNIZED (a state the installed client cannot name: one newer than it, which arrives
    as STATE_UNSPECIFIED or as a bare number). UNKNOWN is Google's own: "TPU node has unknown
    state after a failed repair"."""

    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REIMAGING = "REIMAGING"
    REPAIRING = "REPAIRING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    DELETING = "DELETING"
    HIDING = "HIDING"
    HIDDEN = "HIDDEN"
    UNHIDING = "UNHIDING"
    MISSING = "MISSING"
    UNKNOWN = "UNKNOWN"
    UNRECOGNIZED = "UNRECOGNIZED"

    @classmethod
    def parse(cls, raw: str | None) -> SliceState:
        if raw is None:
            return cls.MISSING
        try:
            return cls(raw.upper())
        except ValueError:
            return cls.UNRECOGNIZED
