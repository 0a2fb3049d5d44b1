"""The benchmarks' records (BENCHMARKS.json) and BENCHMARKS.md, the report rendered from them
(bench/report_md.py): the headline goals first, each judged by its own rule in bench/rules.py.

Every row is tagged with the benchmark that produced it: a run of one benchmark replaces ALL of that
benchmark's rows (none of an older run or an older name survives) and keeps the other benchmarks'.
A replaced row is not dropped: it is appended to BENCHMARKS.history.jsonl beside the JSON (when,
by which commit's run), so an earlier measurement stays on record after a re-run.
The JSON keeps each record as its benchmark wrote it (`met`: the benchmark's own comparison); the
verdicts in the markdown are the rules', computed when it is rendered.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.report_md import git
from ops.json_file import write_atomic


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
    commit: str = ""  # the code's commit when the row was written ("": not recorded)


# Section order: by benchmark (`python -m bench NAME`), then as written.
BENCH_ORDER = ("trainer", "gpu", "checkpoint", "storage", "overhead", "verify", "infra", "recovery",
               "recovery-compute",
               "capacity", "coldboot", "job", "goodput", "goodput-survive", "goodput-pinned",
               "faults", "cost")  # fmt: skip


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


def git_commit() -> str:
    """HEAD's short hash, marked when tracked files differ from it ("": not a git checkout)."""
    head = git("rev-parse", "--short", "HEAD")
    if head and git("status", "--porcelain", "--untracked-files=no"):
        head += " (with uncommitted changes)"
    return head


def stamp(figures: list[Figure], command: str, bench: str = "") -> list[Figure]:
    today, commit = dt.date.today().isoformat(), git_commit()
    for fig in figures:
        fig.bench = fig.bench or bench
        fig.command = fig.command or command
        fig.machine = fig.machine or this_machine()
        fig.date = fig.date or today
        fig.commit = fig.commit or commit
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
    """Merge `figures` into the JSON store beside `markdown` and render the report. `replace`:
    the benchmark whose earlier rows all go first (a complete run); `drop`: rows named here go
    too (e.g. an earlier "not run" row); `extra`: markdown appended at the end."""
    store = markdown.with_suffix(".json")
    before = _load(store)
    rows = {
        k: v
        for k, v in before.items()
        if k not in drop and (replace is None or v.get("bench") != replace)
    }
    rows.update({fig.name: asdict(fig) for fig in figures})
    _keep_history(history_path(markdown), [r for k, r in before.items() if rows.get(k) != r])
    ordered = sorted(rows.values(), key=lambda r: _rank(r.get("bench", "")))
    write_atomic(store, ordered, indent=1)
    render(markdown, extra)


def history_path(markdown: Path) -> Path:
    """Where the rows a run replaced go: BENCHMARKS.history.jsonl beside BENCHMARKS.md."""
    return markdown.with_name(f"{markdown.stem}.history.jsonl")


def _keep_history(path: Path, replaced: list[dict]) -> None:
    """Append each replaced row, as it was, with when and by which commit's run it was replaced."""
    if not replaced:
        return
    stamp_ = {"replaced_on": dt.date.today().isoformat(), "replaced_by_commit": git_commit()}
    with path.open("a") as f:
        for row in replaced:
            f.write(json.dumps({**stamp_, "row": row}) + "\n")


def render(markdown: Path, extra: str = "") -> str:
    """BENCHMARKS.md from the JSON beside it (its records unchanged); returns the text."""
    from bench import report_md

    rows = list(_load(markdown.with_suffix(".json")).values())
    benches = sorted({r.get("bench", "") for r in rows}, key=lambda b: (_rank(b), b))
    text = report_md.report(rows, benches, markdown) + (f"\n{extra}" if extra else "")
    markdown.write_text(text)
    return text
