"""BENCHMARKS.md's text from the records: the headline goals (<= 30 rows of <= 300 characters,
the first table), the judging rules, then one section per benchmark (method from its code,
command, commit, machine, pictures, every row). Verdicts are bench/rules.py's, computed here."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import textwrap
from pathlib import Path

from bench import rules

REPO = Path(__file__).resolve().parents[1]
MAX_ROWS, MAX_CHARS = 30, 300  # the headline table's limits
TIMELINE = "docs/goodput-timeline.png"  # drawn by `bench goodput`
PHASES_PNG = "docs/benchmarks-recovery.png"  # drawn here, from the recovery phases rows
# Where each benchmark's method is written (module docstrings; `path:function` for a runner's).
METHOD = {
    "trainer": ("bench/trainer_bench.py",),
    "gpu": ("bench/runners.py:gpu_figs",),
    "checkpoint": ("bench/checkpoint_bench.py",),
    "storage": ("bench/checkpoint_storage.py", "bench/checkpoint_stall.py"),
    "overhead": ("bench/runners.py:overhead_figs",),
    "verify": ("bench/verify_bench.py",),
    "infra": ("bench/infra_eval.py",),
    "recovery": ("bench/recovery_bench.py",),
    "job": ("bench/job_bench.py",),
    "goodput": ("bench/goodput_bench.py", "bench/badput.py"),
    "goodput-survive": ("bench/goodput_mixes.py",),
    "goodput-pinned": ("bench/goodput_mixes.py",),
    "faults": ("bench/campaign.py",),
    "cost": ("bench/cost_bench.py",),
}  # fmt: skip
INTRO = (
    "Written by `uv run python -m bench` from the raw records in BENCHMARKS.json (`uv run python "
    "-m bench report` renders it again without running anything). The first table holds the "
    "headline goals, each judged by its own rule from `bench/rules.py`, written down once and "
    "applied unchanged (listed under the table, with when they were registered); a missed goal "
    "stays missed. "
    "Then one section per benchmark: its method (from the benchmark's code), command, commit, "
    "machine and every row it recorded, with n (how many measurements the value summarises) and "
    "spread (their range, or each value when few). A re-run replaces a benchmark's rows here; "
    "the rows it replaced stay on record, as they were, in BENCHMARKS.history.jsonl."
)


def git(*args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def report(rows: list[dict], benches: list[str], markdown: Path) -> str:
    parts = [f"# Benchmarks\n\n{INTRO}\n", headline(rows), rules_section()]
    parts += [section(b, [r for r in rows if r.get("bench", "") == b], markdown) for b in benches]
    return "\n".join(parts)


def fmt(value, unit: str = "") -> str:
    if isinstance(value, float):  # a ratio keeps its 3 decimals: 1.000 x, not 1 x
        value = f"{value:.3f}" if unit == "x" else f"{value:.4g}"
    return f"{value} {unit}".strip()


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _labels(names: list[str]) -> list[str]:
    """What tells the rows of one rule apart: their names less the words they share."""
    if len(names) < 2:
        return [""] * len(names)
    head = os.path.commonprefix(names)
    tail = os.path.commonprefix([n[::-1] for n in names])[::-1]
    head = head[: max(head.rfind(" "), head.rfind(","), head.rfind("(")) + 1]
    cut = [i for i, c in enumerate(tail) if c in " ,:)"]
    tail = tail[cut[0] :] if cut else ""
    return [n[len(head) : len(n) - len(tail)].strip(" ,:") for n in names]


def headline_row(rule: rules.Rule, rows: list[dict]) -> str:
    matched = [r for r in rows if re.match(rule.figures, r["name"])]
    link = f"[{rule.bench}](#{rule.bench})"
    if not matched:
        return f"| {_cell(rule.goal)} | not measured: no row recorded |  | not measured | {link} |"
    verdicts = [rules.judge(rule, r, rows) for r in matched]
    labels = _labels([r["name"] for r in matched])
    unit = rule.unit if rule.extract else None
    # A text value the rule read a number from ("92.6 %") is shown as recorded, its unit kept.
    values = [fmt(r["value"] if isinstance(r["value"], str) and not rule.extract else v.value,
                  unit if unit is not None else r.get("unit", ""))
              for v, r in zip(verdicts, matched, strict=True)]  # fmt: skip
    texts = [v.text for v in verdicts]
    if texts[0].startswith("not measured under this rule"):
        shown = f"{texts[0]}"
        if len(matched) == 1:
            shown += f"; recorded: {values[0]}"
        met = "not measured under this rule"
    else:
        shown = "; ".join(f"{lb} {v}".strip() for lb, v in zip(labels, values, strict=True))
        met = _combine(verdicts)
    for label, pattern in rule.beside:
        found = next((r for r in rows if re.match(pattern, r["name"])), None)
        if found is not None:
            shown += f"; {label}: {fmt(found['value'], found.get('unit', ''))}"
    n = ", ".join("" if v.n is None else str(v.n) for v in verdicts)
    cells = [_cell(rule.goal), None, n, _cell(met), link]
    room = MAX_CHARS - len("| " + " | ".join(c or "" for c in cells) + " |")
    shown = _cell(shown)
    if len(shown) > room:
        shown = shown[: room - 20].rstrip() + " ... (see section)"
    cells[1] = shown
    return "| " + " | ".join(cells) + " |"


def _combine(verdicts: list[rules.Verdict]) -> str:
    texts = [v.text for v in verdicts]
    if len(set(texts)) == 1:
        return texts[0]
    missed = sum(v.met is False for v in verdicts)
    if missed:
        return f"no ({missed} of {len(verdicts)} rows)"
    met = sum(v.met is True for v in verdicts)
    rest = "; ".join(dict.fromkeys(t for v, t in zip(verdicts, texts, strict=True) if not v.met))
    return f"yes for {met} of {len(verdicts)}; {rest}" if met else rest


def headline(rows: list[dict]) -> str:
    lines = ["## Headline goals", "", "| goal | measured | n | met? | section |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    lines += [headline_row(rule, rows) for rule in rules.RULES][:MAX_ROWS]
    return "\n".join(lines) + "\n"


def rules_section() -> str:
    added = git("log", "--diff-filter=A", "--format=%h %ad", "--date=short", "--",
                 "bench/rules.py").splitlines()  # fmt: skip
    last = git("log", "-1", "--format=%h %ad", "--date=short", "--", "bench/rules.py")
    changed = git("status", "--porcelain", "--", "bench/rules.py")
    where = f"commit {added[-1]}" if added else "not yet committed when this was rendered"
    if last and added and last != added[-1]:
        where += f"; last changed in {last}"
    if changed and added:
        where += "; changed since, not committed"
    out = [f"## Judging rules, written before the runs (from {rules.REGISTERED} on)", "",
           f"Registered {rules.REGISTERED} in `bench/rules.py` ({where}).", ""]  # fmt: skip
    out += [f"- {g}" for g in rules.GENERAL]
    out += ["", "| rule | goal | rows judged (name pattern) | comparison | set in |",
            "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rules.RULES:
        why = (
            "; not measured where: " + "; ".join(w for _, w in r.unsupported)
            if r.unsupported
            else ""
        )
        out.append(f"| {r.key} | {_cell(r.goal)} | `{_cell(r.figures)}` | "
                   f"{_cell(rules.condition(r) + why)} | {r.source} |")  # fmt: skip
    return "\n".join(out) + "\n"


def _docstring(spec: str) -> str:
    path, _, func = spec.partition(":")
    try:
        tree = ast.parse((REPO / path).read_text())
    except (OSError, SyntaxError):
        return ""
    if func:
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func]
        return (ast.get_docstring(found[0]) or "") if found else ""
    return ast.get_docstring(tree) or ""


def method(bench: str) -> str:
    """The benchmark's docstrings as markdown: prose as prose, lists as lists, the rest fenced."""
    out = []
    for spec in METHOD.get(bench, ()):
        for para in _docstring(spec).split("\n\n"):
            lines = para.splitlines()
            if not lines:
                continue
            if all(not ln.startswith(" ") for ln in lines) or lines[0].startswith("- "):
                out.append(" ".join(ln.strip() for ln in lines) if lines[0][:2] != "- " else para)
            else:
                out.append("```text\n" + textwrap.dedent("\n".join(lines)) + "\n```")
    return "\n\n".join(out)


def _distinct(rows: list[dict], key: str, missing: str = "not recorded") -> str:
    seen = list(dict.fromkeys(r.get(key) or missing for r in rows))
    return "; ".join(f"`{s}`" if key == "command" else s for s in seen)


def section(bench: str, rows: list[dict], markdown: Path) -> str:
    title = bench or "other"
    out = [f"## {title}", ""]
    if text := method(bench):
        out += [text, ""]
    commit = _distinct(rows, "commit")
    if any("run ended" in (r.get("machine") or "") for r in rows) and commit != "not recorded":
        commit += " (rows re-analysed from a saved run: the analysing code's commit)"
    out += [f"- command: {_distinct(rows, 'command')}", f"- commit: {commit}",
            f"- machine: {_distinct(rows, 'machine')}", f"- date: {_distinct(rows, 'date')}", ""]  # fmt: skip
    judged = list(
        dict.fromkeys(k for r in rows if (k := getattr(rules.rule_for(r["name"]), "key", None)))
    )
    if judged:
        out += [f"Judged by the rules {', '.join(judged)} (see the judging rules); where the text "
                "above names a goal or a headline, it is the benchmark's own reading.", ""]  # fmt: skip
    out += _pictures(bench, rows, markdown)
    out += ["| figure | value | n | spread | goal | met | notes |",
            "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        rule = rules.rule_for(r["name"])
        if rule is not None:
            v = rules.judge(rule, r, rows)
            goal = f"{rules.condition(rule)} (rule {rule.key})"
        else:
            v, goal = rules.judge_default(r), r.get("goal", "")
        n = "" if r.get("n") is None else str(r["n"])
        cells = [r["name"], fmt(r["value"], r.get("unit", "")), n, r.get("spread", ""), goal,
                 v.text, r.get("note", "")]  # fmt: skip
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


def _pictures(bench: str, rows: list[dict], markdown: Path) -> list[str]:
    docs = markdown.parent / "docs"
    if bench == "goodput" and (markdown.parent / TIMELINE).exists():
        return ["Training step against wall time in the goodput run; faults, detections and "
                "recoveries marked; underneath, the shares of the badput breakdown.", "",
                f"![goodput timeline]({TIMELINE})", ""]  # fmt: skip
    if bench == "recovery" and docs.is_dir():
        from bench.report_plot import goal_s, recovery_phases

        if recovery_phases(rows, markdown.parent / PHASES_PNG):
            return ["Median seconds of each recovery phase per fault kind, from the fault (the "
                    "phases' medians need not add up to the median total), the goal of "
                    f"{goal_s():g} s marked.", "", f"![recovery phases]({PHASES_PNG})", ""]  # fmt: skip
    if bench in ("goodput-survive", "goodput-pinned") and docs.is_dir():
        from bench.report_plot import badput_shares

        png = f"docs/{bench}-badput.png"
        if badput_shares(rows, markdown.parent / png, bench):
            return ["Badput by Google's categories, each the median over the runs, as a share of "
                    "the wall time; the dashed line is what the goal leaves for all of them.", "",
                    f"![badput, {bench}]({png})", ""]  # fmt: skip
    return []
