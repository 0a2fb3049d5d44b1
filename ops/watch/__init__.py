"""`tpupod watch`: recovery as one state machine.

table (phase, event) -> (phase, action), the only place a phase changes · judge (what was
observed -> one event) · conditions (what one worker's probe means) · actions (one function per
action) · deadlines (every limit and backoff, once) · incident (what survives a restart) ·
progress (steps, commits, fallbacks) · watcher (the loop that ties them).
"""

from ops.watch.actions import GiveUp
from ops.watch.deadlines import Limits, WatchConfig
from ops.watch.watcher import EXIT_DONE, EXIT_GAVE_UP, Watcher

__all__ = ["EXIT_DONE", "EXIT_GAVE_UP", "GiveUp", "Limits", "WatchConfig", "Watcher"]
