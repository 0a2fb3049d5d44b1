"""BENCHMARKS.md: one table of figures, each with its n, spread, goal, command, machine and date.

Every row is tagged with the benchmark that produced it: a run of one benchmark replaces ALL of that
benchmark's rows (none of an older run or an older name survives) and keeps the other benchmarks'.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

HEADER = "| figure | value | n | spread | goal | met | notes | command | machine | date |"
RULE = "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
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
    n: int | None = None  # how many measurements the value summarises
    spread: str = ""  # their range (min-max), or every value when few
    bench: str = ""  # the benchmark that wrote the row (`python -m bench NAME`)

    def row(self) -> str:
        if isinstance(self.value, float):  # a ratio keeps its 3 decimals: 1.000 x, not 1 x
            value = f"{self.value:.3f}" if self.unit == "x" else f"{self.value:.4g}"
        else:
            value = str(self.value)
        met = {True: "yes", False: "no", None: ""}[self.met]
        n = "" if self.n is None else str(self.n)
        cells = [self.name, f"{value} {self.unit}".strip(), n, self.spread, self.goal, met,
                 self.note, f"`{self.command}`", self.machine, self.date]  # fmt: skip
        return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


# Table order: by benchmark (`python -m bench NAME`), then as written.
BENCH_ORDER = (
    "trainer",
    "gpu",
    "checkpoint",
    "overhead",
    "verify",
    "infra",
    "recovery",
    "job",
    "goodput",
    "faults",
    "cost",
)


def _rank(bench: str) -> int:
    return BENCH_ORDER.index(bench) if bench in BENCH_ORDER else len(BENCH_ORDER)


def this_machine() -> str:
    """Architecture, cores, CPU model and its widest vector unit: the same 2-core machine size
    has come with CPUs whose matmul peak differs by more than 2x, and every timing follows."""
    cores = os.cpu_count() or 0
    return f"{platform.machine()} {cores} cores ({cpu_model()}), {platform.system()}"


def cpu_model() -> str:
    """e.g. "AMD EPYC, avx2" from /proc/cpuinfo; "unknown CPU" where it cannot be read."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in info.splitlines()) if v
    )
    flags = set(fields.get("flags", "").split())
    vector = next((f for f in ("avx512f", "avx2", "avx", "neon") if f in flags), "")
    model = " ".join(fields.get("model name", "unknown CPU").split())
    return f"{model}, {vector}" if vector else model


def spread(values: list[float], unit: str = "", digits: int = 1) -> str:
    """min-max of several values (every value when there are at most three)."""
    values = [v for v in values if v is not None]
    if len(values) <= 1:
        return ""
    if len(values) <= 3:
        return ", ".join(f"{v:.{digits}f}" for v in values) + (f" {unit}" if unit else "")
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}" + (f" {unit}" if unit else "")


def median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def stamp(figures: list[Figure], command: str, bench: str = "") -> list[Figure]:
    today = dt.date.today().isoformat()
    for fig in figures:
        fig.bench = fig.bench or bench
        fig.command = fig.command or command
        fig.machine = fig.machine or this_machine()
        fig.date = fig.date or today
    return figures


def _load(json_path: Path) -> dict[str, dict]:
    if json_path.exists():
        fields = Figure.__dataclass_fields__
        rows = json.loads(json_path.read_text())
        return {r["name"]: {k: v for k, v in r.items() if k in fields} for r in rows}
    return {}


def write(
    figures: list[Figure],
    markdown: Path,
    extra: str = "",
    drop: tuple[str, ...] = (),
    replace: str | None = None,
) -> None:
    """Merge `figures` into the JSON store beside `markdown` and rewrite the table. `replace`:
    the benchmark whose earlier rows all go first (a complete run); `drop`: rows named here go
    too (e.g. an earlier "not run" row)."""
    store = markdown.with_suffix(".json")
    rows = {
        k: v
        for k, v in _load(store).items()
        if k not in drop and (replace is None or v.get("bench") != replace)
    }
    rows.update({fig.name: asdict(fig) for fig in figures})
    ordered = sorted(rows.values(), key=lambda r: _rank(r.get("bench", "")))
    store.write_text(json.dumps(ordered, indent=1) + "\n")
    table = "\n".join([HEADER, RULE, *(Figure(**row).row() for row in ordered)])
    body = (
        "# Benchmarks\n\nWritten by `uv run python -m bench`; each row says how it was measured "
        "(`n`: how many measurements the value summarises, `spread`: their range, or each value "
        "when few). Each run of a benchmark replaces all of its rows. Goals come from the issues; "
        "every goal is judged, and a missed goal stays in the table as measured.\n\n"
        f"{BEGIN}\n{table}\n{END}\n\n{extra}"
    )
    markdown.write_text(body)
