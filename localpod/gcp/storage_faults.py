"""Storage faults for the local pod's emulator: real GCS answers 429 and 503 under load, drops
connections and stalls, and clients must ride through all of it (gcsfs, tensorstore and
google-cloud-storage each retry these on their own schedules).

A plan fails a seeded fraction of requests with one of its kinds:
- `429`: Too Many Requests (`rateLimitExceeded`), the answer to a too-hot object or bucket;
- `503`: Service Unavailable (`backendError`);
- `drop`: the connection closes without a response (the request is not carried out);
- `stall`: the request waits `stall_s` seconds, then is served.

The plan comes from `TPUPOD_STORAGE_FAULTS` (JSON) when the emulator starts, and can be read or
replaced at run time at `/_tpupod/faults` (GET; POST a plan as JSON). GET also returns how many
requests were seen and how many of each fault were injected, so a test can show its faults landed.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from localpod.gcp.loopback import send_json

CONTROL_PATH = "/_tpupod/faults"
ENV = "TPUPOD_STORAGE_FAULTS"
Kind = Literal["429", "503", "drop", "stall"]
_REASON = {"429": (429, "rateLimitExceeded"), "503": (503, "backendError")}


class FaultPlan(BaseModel):
    """Which fraction of requests fails, and how."""

    model_config = ConfigDict(extra="forbid")

    rate: float = Field(0.0, ge=0.0, le=1.0, description="fraction of requests that fail")
    kinds: list[Kind] = Field(default_factory=lambda: ["429", "503", "drop"], min_length=1)
    stall_s: float = Field(5.0, ge=0.0, le=600.0, description="how long a stalled request waits")
    seed: int = 0


class FaultGate:
    """Draws a fault (or none) per request from the plan's seeded generator; counts both."""

    def __init__(self, plan: FaultPlan) -> None:
        self._lock = threading.Lock()
        self.set(plan)

    def set(self, plan: FaultPlan) -> None:
        with self._lock:
            self.plan = plan
            self._rng = random.Random(plan.seed)
            self.requests = 0
            self.injected = {kind: 0 for kind in ("429", "503", "drop", "stall")}

    def report(self) -> dict:
        with self._lock:
            return {
                "plan": self.plan.model_dump(),
                "requests": self.requests,
                "injected": dict(self.injected),
            }

    def draw(self) -> str | None:
        with self._lock:
            self.requests += 1
            if self.plan.rate <= 0 or self._rng.random() >= self.plan.rate:
                return None
            kind = self._rng.choice(self.plan.kinds)
            self.injected[kind] += 1
            return kind


def plan_from_env() -> FaultPlan:
    raw = os.environ.get(ENV, "").strip()
    try:
        return FaultPlan.model_validate_json(raw) if raw else FaultPlan()
    except ValueError as e:
        first = str(e).splitlines()[1:2] or [str(e)]
        raise SystemExit(f"error: {ENV}: not a fault plan ({first[0].strip()}); e.g. "
                         '{"rate": 0.05, "kinds": ["429", "503", "drop"]}') from None  # fmt: skip


def control(gate: FaultGate, handler, method: str, body: bytes | None) -> None:
    """The `/_tpupod/faults` endpoint: GET reports, POST replaces the plan (400 on a bad one)."""
    if method == "POST":
        try:
            gate.set(FaultPlan.model_validate_json(body or b"{}"))
        except ValueError as e:
            send_json(handler, 400, {"error": {"code": 400, "message": str(e).splitlines()[0]}})
            return
    send_json(handler, 200, gate.report())


def inject(gate: FaultGate, handler) -> bool:
    """Applies this request's fault, if it draws one; True when the request must not be served."""
    kind = gate.draw()
    if kind is None:
        return False
    if kind == "stall":
        time.sleep(gate.plan.stall_s)
        return False
    if kind == "drop":
        handler.close_connection = True
        with contextlib.suppress(OSError):
            handler.connection.shutdown(socket.SHUT_RDWR)
        return True
    code, reason = _REASON[kind]
    handler.close_connection = False
    send_json(handler, code, {"error": {"code": code, "message": f"injected {kind} (tpupod)",
                                     "errors": [{"reason": reason}]}})  # fmt: skip
    return True
