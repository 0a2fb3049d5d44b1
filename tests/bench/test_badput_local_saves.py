"""The local tier's saves keep the trainer's state `training`, so no sample shows them: the
breakdown takes the loop's time in them, as the trainer counts it (`local_save_s`, the last
value each process reported), from productive into checkpoint save. The categories still add
up to the wall time; a run that reports no such count (a job without the tier) is unchanged
(the control: what the breakdown said before it read the count)."""

from __future__ import annotations

from types import SimpleNamespace

from bench.badput import breakdown
from bench.smoke import T0, _segment, _startup_lines


def run(local_s: tuple[float | None, float | None]) -> tuple[dict, float]:
    first = _segment(100, T0, 0, 100, None, "failed")
    second = _segment(200, first[-1]["t"] + 1.0, 95, 200, 95, "done")
    for seg, value in zip((first, second), local_s, strict=True):
        for worker in (0, 1):
            stepping = [s for s in seg if s["state"] == "training" and s["worker"] == worker]
            for i, s in enumerate(stepping):  # cumulative, as the trainer reports it
                s["local_save_s"] = None if value is None else value * (i + 1) / len(stepping)
    lines = _startup_lines(T0, 100) + _startup_lines(second[0]["t"], 200)
    record = SimpleNamespace(sampled={"status": first + second, "lines": lines})
    start, end = T0 + 5, second[-1]["t"]
    return breakdown(record, start, end), end - start


def test_the_local_tiers_saves_move_from_productive_to_checkpoint_save():
    before, wall = run((None, None))
    after, _ = run((1.5, 2.25))
    assert abs(sum(after.values()) - wall) < 0.01
    assert abs(before["productive"] - after["productive"] - 3.75) < 0.01, (before, after)
    assert abs(after["checkpoint save"] - before["checkpoint save"] - 3.75) < 0.01
    for category in ("startup", "restore", "compile", "lost progress", "recovery / infra"):
        assert after[category] == before[category], category


def test_a_count_larger_than_the_segments_productive_time_moves_no_more_than_it():
    before, wall = run((None, None))
    after, _ = run((10_000.0, None))
    assert after["productive"] >= 0 and abs(sum(after.values()) - wall) < 0.01
    assert after["checkpoint save"] < before["checkpoint save"] + before["productive"] + 0.01
