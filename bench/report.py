"""BENCHMARKS.md: one table of figures, each with its goal, command, machine and date.

Rows are keyed by figure name, so running one benchmark updates its rows and keeps the others.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

HEADER = "| figure | value | goal | met | notes | command | machine | date |"
RULE = "| --- | --- | --- | --- | --- | --- | --- | --- |"
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"


@dataclass
class Figure:
    name: str
    value: float | str
    unit: str = ""
    goal: str = ""
    met: bool | None = None
    command: str = ""
    machine: str = ""
    date: str = ""
    note: str = ""  # how to read the value: assumptions, merged phases, load

    def row(self) -> str:
        value = f"{self.value:.4g}" if isinstance(self.value, float) else str(self.value)
        met = {True: "yes", False: "no", None: ""}[self.met]
        cells = [self.name, f"{value} {self.unit}".strip(), self.goal, met, self.note,
                 f"`{self.command}`", self.machine, self.date]  # fmt: skip
        return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def this_machine() -> str:
    cores = os.cpu_count() or 0
    return f"{platform.machine()} {cores} cores, {platform.system()}"


def stamp(figures: list[Figure], command: str) -> list[Figure]:
    today = dt.date.today().isoformat()
    for fig in figures:
        fig.command = fig.command or command
        fig.machine = fig.machine or this_machine()
        fig.date = fig.date or today
    return figures


def _load(json_path: Path) -> dict[str, dict]:
    if json_path.exists():
        return {row["name"]: row for row in json.loads(json_path.read_text())}
    return {}


def write(
    figures: list[Figure], markdown: Path, extra: str = "", drop: tuple[str, ...] = ()
) -> None:
    """Merge `figures` into the JSON store beside `markdown` (removing rows named in `drop`,
    e.g. an earlier "not run" row) and rewrite the table."""
    store = markdown.with_suffix(".json")
    rows = {k: v for k, v in _load(store).items() if k not in drop}
    rows.update({fig.name: asdict(fig) for fig in figures})
    store.write_text(json.dumps(list(rows.values()), indent=1) + "\n")
    table = "\n".join([HEADER, RULE, *(Figure(**row).row() for row in rows.values())])
    body = (
        "# Benchmarks\n\nWritten by `uv run python -m bench`; each row says how it was measured. "
        "Goals come from the issues; a missed goal stays in the table as measured.\n\n"
        f"{BEGIN}\n{table}\n{END}\n\n{extra}"
    )
    markdown.write_text(body)
