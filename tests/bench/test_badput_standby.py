"""A promoted standby's trainer (issue 50) started its process when it parked, minutes before
its attempt: the badput breakdown counts its startup from the promotion (the trainer's own
`promoted_at`, or, in records from before it, the launcher's note), so the categories still add
up to the wall time. Negative control: without either, /proc's start time counts the parked
minutes as startup, overlapping the previous attempt's productive time."""

from __future__ import annotations

from types import SimpleNamespace

from bench.badput import breakdown
from bench.smoke import T0, _segment, _startup_lines

PARKED_AT = T0 - 600.0  # the standby's process started (and parked) 10 min before the run


def run(promotion: str) -> tuple[dict, float, float]:
    first = _segment(100, T0, 0, 100, None, "failed")
    promoted = first[-1]["t"] + 1.0  # detection and restart after the crash
    second = _segment(200, promoted + 0.6, 95, 200, 95, "done")
    lines = _startup_lines(T0, 100) + _startup_lines(second[0]["t"], 200)
    started = next(x for x in lines if x["json"]["event"] == "started" and x["json"]["pid"] == 200)
    started["json"]["process_start"] = PARKED_AT
    if promotion == "trainer":
        started["json"]["promoted_at"] = promoted
    elif promotion == "note":
        lines.append({"t": promoted + 0.1,
                      "text": "jobrun: 2026-12-05T07:43:34Z promoted the standby (pid 200): "
                              "its imports done"})  # fmt: skip
    record = SimpleNamespace(sampled={"status": first + second, "lines": lines})
    start, end = T0 + 5, second[-1]["t"]
    return breakdown(record, start, end), end - start, promoted


def test_a_promoted_standbys_startup_counts_from_its_promotion():
    for promotion, late in (("trainer", 0.0), ("note", 0.1)):
        out, wall, promoted = run(promotion)
        assert abs(sum(out.values()) - wall) < 0.01  # rounded to ms
        assert abs(out["startup"] - (2.5 - late)) < 0.05, (promotion, out)  # promotion -> setup
        assert abs(out["recovery / infra"] - (1.0 + late)) < 0.05, (promotion, out)
        assert out["other"] < 0.2, (promotion, out)


def test_without_the_promotion_the_parked_minutes_overlap_the_previous_attempt():
    out, wall, _ = run("none")
    assert out["startup"] > 10.0 and out["recovery / infra"] == 0.0  # the bug this guards
    assert sum(v for k, v in out.items() if k != "other") > wall
