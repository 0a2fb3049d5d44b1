"""The recovery journal: one JSON object per line, each with its wall time.

The goodput report (bench/) and the demo read it back; the terminal gets one line per event.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

# Event -> terminal colour; unknown events print plain.
STYLES = {
    "detected": "bold yellow",
    "recreated": "cyan",
    "ready": "cyan",
    "bootstrapped": "cyan",
    "restarted": "cyan",
    "resumed": "bold green",
    "done": "bold green",
    "gave_up": "bold red",
    "error": "red",
    "stockout": "yellow",
}
# Events kept in the journal file only (not echoed, not sent to the bucket): every recovery-table
# transition (ops.watch.transitions) is there for the record; the milestones say the same to a person.
QUIET = {"transition"}


class Journal:
    """Appends events to `path` (None: terminal only) and echoes them to `console`."""

    def __init__(
        self,
        path: str | Path | None,
        console: Console | None = None,
        sink: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.path = Path(path) if path else None
        self.console = console
        self.sink = sink  # e.g. ops.watch.remote_state.RemoteState.append: the bucket's copy
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def event(self, name: str, message: str = "", **fields: Any) -> dict[str, Any]:
        record = {"time": time.time(), "event": name, "message": message, **fields}
        with self._lock:
            self.events.append(record)
            if self.path is not None:
                with self.path.open("a") as out:
                    out.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        if self.sink is not None and name not in QUIET:  # one bucket write each: not on the
            self.sink(record)  # recovery path for a record the milestones already tell
        if self.console is not None:
            echo(self.console, record)
        return record


def echo(console: Console, record: dict[str, Any], prefix: str = "") -> None:
    """One terminal line for one event (also for events read back from the bucket)."""
    if record.get("event") in QUIET:
        return
    stamp = time.strftime("%H:%M:%S", time.localtime(record.get("time", 0)))
    name = str(record.get("event", ""))
    text = f"{prefix}{stamp} {name:<12} {record.get('message', '')}"
    console.print(text, style=STYLES.get(name, ""), markup=False, highlight=False)


def read(path: str | Path) -> list[dict[str, Any]]:
    """All events of a journal file, oldest first; a torn last line is skipped."""
    events = []
    for line in Path(path).read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events
