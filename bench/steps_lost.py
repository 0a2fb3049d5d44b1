"""Steps lost on a fault without notice (kill, crash, stockout, hang), judged one way in every
benchmark that reports them (recovery, goodput, the fault campaign, the pod-storage rows).

Saves are asynchronous: the loop steps on while a save writes, and only committed steps are
restored. A kill that lands while the save begun at step S (a multiple of the interval) still
writes loses the steps since S and the interval before S too. So "at most one checkpoint interval"
(issue 15's wording) cannot hold for every kill of an async run; what does hold, once saves are
faster than the interval, is one interval plus the steps since the save in flight began:
the restored step is the newest committed one, and no older than S minus one interval. What that
still rules out: a restore older than the newest committed step, and two saves outstanding at once
(one deferred, or slower than an interval), either of which loses a second interval or more.
"""

from __future__ import annotations

from dataclasses import dataclass


def goal_text(interval: int) -> str:
    return f"<= 1 checkpoint interval ({interval}) + the steps of a save in flight"


@dataclass(frozen=True)
class Loss:
    """One fault: the last step the trainer reached, the step it restored, and the newest step
    the trainers had reported committed before the fault (None: not seen)."""

    step_at_fault: int
    restored_from: int
    committed_before: int | None = None

    @property
    def steps(self) -> int:
        return max(0, self.step_at_fault - self.restored_from)

    def within(self, interval: int) -> bool:
        if self.committed_before is not None and self.restored_from < self.committed_before:
            return False  # a committed step was not restored
        newest_due = self.step_at_fault // interval * interval
        return self.restored_from >= newest_due - interval

    def over_one_interval(self, interval: int) -> int:
        """Steps beyond one interval (0 if none): those of the save in flight at the fault."""
        return max(0, self.steps - interval)


def judge(losses: list[Loss], interval: int | None) -> tuple[bool | None, str]:
    """Met only if every fault is within the bound; the note counts the faults that lost more
    than one interval and by how much, so the stricter reading stays visible."""
    if not losses or not interval:
        return None, ""
    inside = [x for x in losses if x.within(interval)]
    over = sorted(x.over_one_interval(interval) for x in inside if x.over_one_interval(interval))
    note = (
        f"{len(over)} of {len(losses)} lost more than one interval (by "
        f"{', '.join(map(str, over))} steps), each while the save begun at the interval's start "
        "still wrote"
        if over
        else "none lost more than one interval"
    )
    beyond = [x for x in losses if not x.within(interval)]
    if beyond:
        note += "; beyond the bound: " + ", ".join(
            f"step {x.step_at_fault} restored from {x.restored_from}"
            + (
                f" (committed before: {x.committed_before})"
                if x.committed_before is not None
                else ""
            )
            for x in beyond
        )
    return not beyond, note
