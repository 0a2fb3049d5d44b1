"""The pod controller's calls into its Cloud TPU API (`tpupod local stockout|quota|answer`): the
injections of localpod.gcp.tpu_faults and the chip quota of localpod.gcp.tpu_quota, by control path."""

from __future__ import annotations

from localpod.gcp.tpu_nodes import TpuService


def actions(tpu: TpuService, query: dict[str, str]) -> dict:
    """The TPU API's injections (localpod.gcp.tpu_faults) and its quota (localpod.gcp.tpu_quota)."""
    count, zone, faults = int(query.get("count", "1")), query.get("zone"), tpu.faults

    def limits() -> dict:
        given = [int(query[k]) if query.get(k) else None for k in ("region", "zone")]
        return {"quota": tpu.quota.set(*given)}

    def answer() -> dict:
        if query.get("clear"):
            faults.clear_answers()
            return {"cleared": True}
        if query.get("target") == "node":
            return {"answer": tpu.answer_node(query.get("state"), query.get("health"))}
        pending = faults.answer_requests(count, zone, query.get("fail"), query.get("state"))
        return {"pending": pending}

    return {
        "/stockout": lambda: {"pending": tpu.inject_stockout(count, zone)},
        "/quota": lambda: {"pending": faults.inject_quota(count, zone, query.get("scope", "zone"))},
        "/unavailable": lambda: {"pending": faults.inject_unavailable(count)},
        "/quota-limits": limits,
        "/answer": answer,
    }
