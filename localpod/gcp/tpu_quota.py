"""The pod project's TPU quota, kept as Google keeps it: chips per region and per zone, spot and
on-demand apart, one quota per generation (https://cloud.google.com/tpu/docs/quota). A create
that would go over a limit is refused at once with HTTP 429 naming the quota
(`localpod.gcp.tpu_requests.quota_exceeded`: Google's message and QuotaFailure).

What holds quota: every node and every queued request not deleted, in whatever state (a request
and the node it brought count once). Google does not say whether a FAILED or SUSPENDED request
still holds quota; here it does, the stricter reading. The pod's own `cpu-N` counts N chips
under a name made as Google makes them, `TPULocalCPU[Preemptible]PerProjectPer{Region,Zone}
ForTPUAPI`; a real type counts its chips (infra.catalog) under its generation's names. A
reserved node uses on-demand quota, as Google's reservations do; spot and preemptible share one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from infra import catalog
from localpod.gcp.tpu_requests import ApiError, quota_exceeded

LOCAL_QUOTA = "TPULocalCPU{spot}"  # the pod's cpu-N, a generation of its own
REGION = "local"  # the region of the pod's zones (localpod.vm.metadata_server.ZONES)


@dataclass(frozen=True)
class Holder:
    """Something that holds quota: a node, or a queued request for one."""

    zone: str
    accelerator: str
    spot: bool


def holder(zone: str, request: dict) -> Holder:
    """What a Node request (its acceleratorType and schedulingConfig) holds in `zone`."""
    scheduling = request.get("schedulingConfig") or {}
    spot = bool(scheduling.get("spot") or scheduling.get("preemptible"))
    return Holder(zone, str(request.get("acceleratorType", "")), spot)


def family(accelerator: str) -> tuple[str, int]:
    """(quota name template, chips) of an accelerator type the pod accepted."""
    if accelerator.startswith("cpu-"):
        return LOCAL_QUOTA, int(accelerator.removeprefix("cpu-"))
    found = catalog.lookup(accelerator)
    return found.generation.quota, found.chips


class Quota:
    """Limits in chips per tier (spot and on-demand each have their own): `region` for the pod's
    region, `zone` for each of its zones; None is no limit (the default)."""

    def __init__(self, region: int | None = None, zone: int | None = None) -> None:
        self._lock = threading.Lock()
        self.limits: dict[str, int | None] = {}
        self.set(region, zone)

    def set(self, region: int | None, zone: int | None) -> dict[str, int | None]:
        for value in (region, zone):
            if value is not None and value < 0:
                raise ValueError(f"a quota of {value} chips: give 0 or more (none: no limit)")
        with self._lock:
            self.limits = {"region": region, "zone": zone}
            return dict(self.limits)

    def check(self, holders: Iterable[Holder], new: Holder) -> None:
        """429 RESOURCE_EXHAUSTED if `new` would take its quota over a limit, naming each
        limit it would break (the region's first, as Google lists them)."""
        template, chips = family(new.accelerator)
        held = [h for h in holders if family(h.accelerator)[0] == template and h.spot == new.spot]
        with self._lock:
            limits = dict(self.limits)
        broken = []
        for scope in catalog.QUOTA_SCOPES:
            limit = limits[scope]
            here = [h for h in held if scope == "region" or h.zone == new.zone]
            if limit is not None and sum(family(h.accelerator)[1] for h in here) + chips > limit:
                broken.append((scope, limit))
        if broken:
            raise self.refusal(new, broken)

    def refusal(self, new: Holder, broken: list[tuple[str, int | None]]) -> ApiError:
        """The 429 for `new` over the limits `broken` ((scope, limit); a limit of None, for a
        refusal injected where the pod sets none, reads 0)."""
        template, _ = family(new.accelerator)
        place = {"region": f"region {REGION}", "zone": f"zone {new.zone}"}
        return quota_exceeded([(catalog.quota_metric(template, new.spot, scope), limit or 0,
                                place[scope]) for scope, limit in broken])  # fmt: skip

    def limit(self, scope: str) -> int | None:
        with self._lock:
            return self.limits[scope]
