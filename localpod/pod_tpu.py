"""What a LocalPod asks of its Cloud TPU API besides nodes and requests: the next calls refused
(stockout, quota, outage), its chip quota, and the answers Google gives that a healthy pod never
does (localpod.gcp.tpu_faults), all through the pod controller's control API."""

from __future__ import annotations

from urllib.parse import urlencode


class TpuAnswers:
    """Mixed into localpod.pod.LocalPod, whose `_request` reaches the controller."""

    def _request(self, method: str, path: str, timeout: float = 10.0) -> dict:
        raise NotImplementedError

    def _post(self, path: str, **query: object) -> dict:
        given = {k: v for k, v in query.items() if v is not None}
        return self._request("POST", f"{path}?{urlencode(given)}")

    def inject_stockout(self, count: int = 1, zone: str | None = None) -> int:
        """The next `count` creates (in `zone`; None: any zone) fail with RESOURCE_EXHAUSTED
        (a queued resource waits instead); returns how many are pending there."""
        return self._post("/stockout", count=count, zone=zone)["pending"]

    def inject_unavailable(self, count: int = 1) -> int:
        """The next `count` TPU API calls of any kind answer HTTP 503 UNAVAILABLE."""
        return self._post("/unavailable", count=count)["pending"]

    def inject_quota(self, count: int = 1, zone: str | None = None, scope: str = "zone") -> int:
        """The next `count` creates (in `zone`; None: any) are refused at once for the `scope`
        quota ("zone" or "region"), HTTP 429 naming it as Google does."""
        return self._post("/quota", count=count, zone=zone, scope=scope)["pending"]

    def set_quota(self, chips: int | None = None, zone_chips: int | None = None) -> dict:
        """The chip quota per region and per zone from now on, each tier its own (None: none)."""
        return self._post("/quota-limits", region=chips, zone=zone_chips)["quota"]

    def answer_node(self, state: str | int | None = None, health: str | None = None) -> dict:
        """The node answers `state` (a name, or a number as a new one would come) and/or
        `health`, while the slice goes on as it is, until the node is deleted."""
        return self._post("/answer", target="node", state=state, health=health)["answer"]

    def answer_requests(self, fail: str | None = None, state: str | int | None = None,
                        count: int = 1, zone: str | None = None) -> int:  # fmt: skip
        """The next `count` queued requests filed (in `zone`) end FAILED for `fail`
        (localpod.gcp.tpu_faults.FAILURES), or answer `state` and are never provisioned."""
        return self._post("/answer", target="request", fail=fail, state=state, count=count,
                          zone=zone)["pending"]  # fmt: skip

    def clear_answers(self) -> None:
        """Every injected answer and pending refusal gone."""
        self._post("/answer", clear=1)
