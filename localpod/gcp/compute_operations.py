"""Compute Engine v1 operations (zonal, regional, global) as its API shapes them: `compute#operation`
with `status` PENDING/RUNNING/DONE, `operationType`, `targetLink`, and on failure `error.errors[]`
plus `httpErrorStatusCode`; `wait` returns once DONE or after at most 2 minutes, as Google's does."""

from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import UTC, datetime

from localpod.gcp.compute_errors import not_found

WAIT_LIMIT_S = 120.0  # Google: operations.wait returns after at most 2 minutes


def timestamp() -> str:
    """RFC 3339 with the offset, as Compute Engine writes its timestamps."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "-00:00")


def resource_id() -> str:
    return str(secrets.randbelow(8 * 10**18) + 10**18)


class ComputeOperations:
    def __init__(self, links) -> None:
        """`links(path)`: the full URL of a resource path (projects/P/...), as selfLinks are."""
        self._links = links
        self._cond = threading.Condition()
        self._ops: dict[str, dict] = {}

    def new(self, scope: str, kind: str, target: str, user: str = "") -> dict:
        """An operation of `kind` (insert, delete, resize, ...) on `target` (a resource path),
        in `scope` (projects/P/zones/Z, projects/P/regions/R or projects/P/global)."""
        name = f"operation-{time.time_ns() // 10**6}-{secrets.token_hex(6)}"
        path = f"{scope}/operations/{name}"
        op = {
            "kind": "compute#operation",
            "id": resource_id(),
            "name": name,
            "operationType": kind,
            "targetLink": self._links(target),
            "targetId": resource_id(),
            "status": "RUNNING",
            "user": user,
            "progress": 0,
            "insertTime": timestamp(),
            "startTime": timestamp(),
            "selfLink": self._links(path),
        }
        where = scope.split("/")
        if len(where) == 4:  # zones/Z or regions/R
            op[where[2][:-1]] = self._links("/".join(where))
        with self._cond:
            self._ops[path] = op
        return dict(op)

    def finish(self, op: dict, error: tuple[int, str, str] | None = None) -> None:
        """DONE; `error`: (HTTP status, Compute error code, message)."""
        path = _path(op["selfLink"])
        with self._cond:
            live = self._ops.get(path)
            if live is None or live["status"] == "DONE":
                return
            live.update(status="DONE", progress=100, endTime=timestamp())
            if error is not None:
                status, code, message = error
                live["error"] = {"errors": [{"code": code, "message": message}]}
                live.update(httpErrorStatusCode=status, httpErrorMessage=_HTTP.get(status, ""))
            self._cond.notify_all()

    def get(self, path: str) -> dict:
        with self._cond:
            op = self._ops.get(path)
            if op is None:
                raise not_found(path)
            return json.loads(json.dumps(op))

    def wait(self, path: str) -> dict:
        deadline = time.monotonic() + WAIT_LIMIT_S
        with self._cond:
            while (op := self.get(path))["status"] != "DONE" and time.monotonic() < deadline:
                self._cond.wait(min(1.0, deadline - time.monotonic()))
        return op


_HTTP = {400: "BAD REQUEST", 403: "FORBIDDEN", 404: "NOT FOUND", 503: "SERVICE UNAVAILABLE"}


def _path(link: str) -> str:
    """projects/... of a full URL."""
    return "projects/" + link.split("/projects/", 1)[1]
