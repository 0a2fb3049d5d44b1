"""projects.locations.operations of the pod's Cloud TPU v2 API: the long-running operations that
nodes and queued resources return, shaped as google.cloud.tpu_v2 has them (OperationMetadata with
target and verb; `done` with a `response` or an `error`)."""

from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import UTC, datetime

from localpod.gcp.tpu_requests import not_found

METADATA_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def copy(operation: dict) -> dict:
    """A deep copy to serve (the original changes when the operation finishes)."""
    return json.loads(json.dumps(operation))


class Operations:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._operations: dict[str, dict] = {}

    def new(self, target: str, verb: str) -> dict:
        """An operation on `target` (.../nodes/N or .../queuedResources/Q), not done yet."""
        parent = target.rsplit("/", 2)[0]
        stamp = f"{time.time_ns() // 10**6}-{secrets.token_hex(6)}"
        operation = {
            "name": f"{parent}/operations/operation-{stamp}",
            "metadata": {
                "@type": METADATA_TYPE,
                "createTime": now(),
                "target": target,
                "verb": verb,
                "cancelRequested": False,
                "apiVersion": "v2",
            },
            "done": False,
        }
        with self._lock:
            self._operations[operation["name"]] = operation
        return operation

    def finish(self, operation: dict, result: dict) -> dict:
        """Done, with `result` ({"response": ...} or {"error": ...}); returns what to serve."""
        with self._lock:
            operation["metadata"]["endTime"] = now()
            operation.update(result, done=True)
            return copy(operation)

    def drop(self, operation: dict) -> None:
        """Forget an operation whose call failed before it began."""
        with self._lock:
            self._operations.pop(operation["name"], None)

    def get(self, name: str) -> dict:
        with self._lock:
            operation = self._operations.get(name)
            if operation is None:
                raise not_found(name)
            return copy(operation)
