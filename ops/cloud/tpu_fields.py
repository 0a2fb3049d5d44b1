"""The TPU API's enum fields, read so that a value the installed client lacks never raises.

Google adds states; the REST client asks for enums as numbers (`$alt=json;enum-encoding=int`)
and parses with unknown fields ignored, so google-cloud-tpu reads a newer value as a bare int
(its enum class raises ValueError on it) and a newer name as 0, *_UNSPECIFIED (checked against
the installed client: tests/ops/test_tpu_fields.py). Both are a value the client cannot name.
"""

from __future__ import annotations

import enum

from google.cloud import tpu_v2
from google.cloud.tpu_v2 import gapic_version

CLIENT = f"google-cloud-tpu {gapic_version.__version__}"


def enum_name(kind: type[enum.IntEnum], value: object) -> str | None:
    """The name of `value` in `kind`; None for a value the client cannot name (a number it
    lacks, or 0: *_UNSPECIFIED, what a name it lacks becomes)."""
    try:
        found = kind(value)
    except (ValueError, TypeError):
        return None
    return found.name if found.value else None


def unnamed(what: str, value: object) -> str:
    """Why a value has no name, for the journal: the number, or the name the client gave it."""
    if isinstance(value, enum.Enum):
        return f"{what} {value.name}: a value {CLIENT} cannot name (or none was given)"
    return f"{what} {value}: a value {CLIENT} cannot name"


def symptoms(node: tpu_v2.Node) -> list[str]:
    """What the TPU API saw go wrong on the node (OUT_OF_MEMORY on worker 1, ...), for the
    incident's reason and `tpupod status`."""
    kind = tpu_v2.Symptom.SymptomType
    return [f"{enum_name(kind, s.symptom_type) or s.symptom_type} on worker {s.worker_id or '?'}"
            + (f" ({s.details})" if s.details else "") for s in node.symptoms]  # fmt: skip
