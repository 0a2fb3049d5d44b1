"""The run's hold (`tpupod stop`, until `tpupod start`: ops.watch.remote_state keeps it in the
bucket) as the watcher sees it: read at most every HOLD_CHECK_S, and afresh before anything
that would act; a change journaled once (`held`, `unheld`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from ops.watch.journal import Journal

HOLD_CHECK_S = 2.0  # a hold is read at most this often, and before every action


class Hold:
    def __init__(self, read: Callable[[], dict | None] | None, journal: Journal):
        self.read = read or (lambda: None)  # no bucket: never held
        self.journal = journal
        self._seen: tuple[float, dict | None] = (0.0, None)
        self._said = False

    def held(self, fresh: bool = False) -> bool:
        """The run is stopped on purpose: watch but never act, until `start`."""
        now = time.time()
        if fresh or now - self._seen[0] > HOLD_CHECK_S:
            self._seen = (now, self.read())
        hold = self._seen[1]
        if hold and not self._said:
            by = hold.get("by", "someone")
            self.journal.event("held", f"run stopped by {by} (`tpupod start` resumes it); "
                               "watching without acting", by=by)  # fmt: skip
        elif not hold and self._said:
            self.journal.event("unheld", "run started again: recovery resumes")
        self._said = bool(hold)
        return bool(hold)
