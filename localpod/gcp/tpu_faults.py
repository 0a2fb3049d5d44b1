"""What the pod's Cloud TPU API answers on demand, as Google answers it: a stockout, a quota
refusal or an outage for the next calls, and the answers recovery must survive that a healthy
pod never gives: a node state the installed client does not know (a new name, or a number) or
Google's UNKNOWN, a spot node under maintenance that keeps running, a queued request FAILED for
each reason Google gives, or in a state the client does not know.

Counted answers wait per zone (None: any zone) and are taken the zone's own first. A node's
answer lasts until the node is deleted or the answers are cleared.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from localpod.state import PodError
from localpod.vm.metadata_server import ZONES

STOCKOUT = (
    'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud TPU '
    "Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x{eid}]"
)
# A queued request's failedData.error (a google.rpc.Status) per kind of failure. No capture of
# one is public: each is the error Google gives for the same failure of an operation or a call
# (stockout, quota, a bad request, a short reservation: captured), and `expired` is the pod's
# own wording for a request not filled before its validUntilDuration.
FAILURES: dict[str, tuple[int, str]] = {
    "stockout": (8, STOCKOUT),
    "quota": (8, "{quota}"),
    "region-quota": (8, "{quota}"),
    "expired": (4, "the request could not be fulfilled before its validUntilDuration"),
    "invalid": (3, 'Cloud TPU received a bad request. The requested accelerator configuration for '
                'accelerator type, "{accelerator}", could not be found in the zonal accelerator '
                'configurations for "{zone}".; the accelerator {accelerator} was not found in zone '
                "{zone} [EID: 0x{eid}]"),
    "reservation": (9, "Insufficient reserved capacity. Contact customer support to increase your "
                    "reservation. [EID: 0x{eid}]"),
}  # fmt: skip
NODE_FIELDS = ("state", "health")


def failure(kind: str, zone: str, accelerator: str, quota: str = "") -> dict:
    """failedData.error for a request failed as `kind` (FAILURES); `quota`: the 429's message."""
    code, text = FAILURES[kind]
    eid = secrets.token_hex(8)
    return {"code": code, "message": text.format(zone=zone, eid=eid, accelerator=accelerator,
                                                 quota=quota)}  # fmt: skip


def enum_value(raw: str) -> str | int:
    """An enum as a client may read it: a name as given, digits as a number (Google's REST
    answers numbers to a client that asks for them)."""
    return int(raw) if raw.strip().isdigit() else raw.strip()


class Pending:
    """Answers waiting per zone (None: any zone), each taken once."""

    def __init__(self) -> None:
        self._by_zone: dict[str | None, list[Any]] = {}

    def add(self, zone: str | None, items: list[Any]) -> int:
        if zone is not None and zone not in ZONES:
            raise PodError(f"zone {zone!r} is not one of the pod's zones ({', '.join(ZONES)})")
        self._by_zone.setdefault(zone, []).extend(items)
        return len(self._by_zone[zone])

    def take(self, zone: str) -> Any | None:
        """The next answer for `zone`: the zone's own first, then one meant for any zone."""
        for key in (zone, None):
            if self._by_zone.get(key):
                return self._by_zone[key].pop(0)
        return None

    def clear(self) -> None:
        self._by_zone.clear()


class TpuFaults:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stockouts = Pending()
        self._quota = Pending()  # each: the scope whose quota refuses ("zone" or "region")
        self._requests = Pending()  # each: {"fail": kind} or {"state": name or number}
        self._unavailable = 0
        self._node: dict = {}  # {"node_id", "state", "health"}: what the node answers

    # -- the next calls ----------------------------------------------------------------------
    def inject_stockout(self, count: int, zone: str | None) -> int:
        with self._lock:
            return self._stockouts.add(zone, [True] * count)

    def take_stockout(self, zone: str) -> bool:
        with self._lock:
            return bool(self._stockouts.take(zone))

    def inject_quota(self, count: int, zone: str | None, scope: str = "zone") -> int:
        if scope not in ("zone", "region"):
            raise PodError(f"quota scope {scope!r}: zone or region")
        with self._lock:
            return self._quota.add(zone, [scope] * count)

    def take_quota(self, zone: str) -> str | None:
        """The scope of a quota refusal pending for a create in `zone`, if any."""
        with self._lock:
            return self._quota.take(zone)

    def inject_unavailable(self, count: int) -> int:
        with self._lock:
            self._unavailable += count
            return self._unavailable

    def take_unavailable(self) -> bool:
        with self._lock:
            if self._unavailable:
                self._unavailable -= 1
                return True
            return False

    # -- answers -----------------------------------------------------------------------------
    def answer_node(self, node_id: str, state: str | None, health: str | None) -> dict:
        """The node `node_id` answers this state and/or health (the slice goes on as it was)."""
        answer = {k: enum_value(v) for k, v in (("state", state), ("health", health)) if v}
        if not answer:
            raise PodError("a node answer names a state, a health or both")
        with self._lock:
            kept = self._node if self._node.get("node_id") == node_id else {}
            self._node = {**kept, **answer, "node_id": node_id}
            return dict(self._node)

    def node_answer(self, node_id: str) -> dict:
        """The fields the node `node_id` answers instead of its own (none for another node)."""
        with self._lock:
            node = self._node if self._node.get("node_id") == node_id else {}
            return {k: v for k, v in node.items() if k in NODE_FIELDS}

    def answer_requests(self, count: int, zone: str | None, fail: str | None = None,
                        state: str | None = None) -> int:  # fmt: skip
        """The next `count` queued requests filed (in `zone`) end FAILED as `fail` (FAILURES),
        or answer `state` and wait, never provisioned."""
        if (fail is None) == (state is None):
            raise PodError("a request answer is either --fail KIND or --state STATE")
        if fail is not None and fail not in FAILURES:
            raise PodError(f"--fail {fail!r}: one of {', '.join(FAILURES)}")
        answer = {"fail": fail} if fail else {"state": enum_value(state or "")}
        with self._lock:
            return self._requests.add(zone, [answer] * count)

    def take_request_answer(self, zone: str) -> dict | None:
        with self._lock:
            return self._requests.take(zone)

    def clear_answers(self) -> None:
        """Every answer and pending refusal gone: the API answers as the slice is."""
        with self._lock:
            self._node = {}
            for pending in (self._requests, self._stockouts, self._quota):
                pending.clear()
            self._unavailable = 0
