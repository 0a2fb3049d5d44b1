"""BENCHMARKS.md as a report: the headline table comes first and stays small, every verdict is its
pre-registered rule's (bench/rules.py), few runs never make a goal met, a miss stays a miss.
Seconds, no pod: the report is rendered from records written here (and from BENCHMARKS.json)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from bench import report, rules
from bench.__main__ import main

REPO = Path(__file__).resolve().parents[2]
KILL = "recovery, no-notice kill: fault -> first step (recovery run, two tiers)"
NOTICE = "recovery, preemption with notice: fault -> first step (recovery run, two tiers)"


def _row(name: str, value, unit: str = "s", n: int | None = 3, **kw) -> dict:
    return {"name": name, "value": value, "unit": unit, "n": n, "bench": "recovery", **kw}


def _tables(text: str) -> list[list[str]]:
    """Every markdown table in `text`, as its lines, in order."""
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def _render(tmp_path: Path, rows: list[dict]) -> tuple[str, list[str]]:
    md = tmp_path / "BENCHMARKS.md"
    md.with_suffix(".json").write_text(json.dumps(rows))
    text = report.render(md)
    return text, _tables(text)[0]


def _headline(lines: list[str], goal: str) -> list[str]:
    found = [ln for ln in lines if ln.startswith(f"| {goal} |")]
    assert len(found) == 1, (goal, lines)
    return [c.strip() for c in found[0].strip("|").split(" | ")]


def test_headline_is_the_first_table_and_small(tmp_path: Path):
    """On the committed records: first table, <= 30 rows, <= 300 characters each; JSON kept."""
    shutil.copy(REPO / "BENCHMARKS.json", tmp_path / "BENCHMARKS.json")
    before = (tmp_path / "BENCHMARKS.json").read_text()
    text = report.render(tmp_path / "BENCHMARKS.md")
    first = _tables(text)[0]
    assert first[0] == "| goal | measured | n | met? | section |"
    assert text.index(first[0]) < text.index("## Judging rules")
    body = first[2:]
    assert 0 < len(body) <= 30 and all(len(line) <= 300 for line in body)
    assert all(
        re.search(r"\[[\w-]+\]\(#[\w-]+\) \|$", line) for line in body
    )  # a link to its section
    assert (tmp_path / "BENCHMARKS.json").read_text() == before  # rendering rewrites no record
    assert all(f"## {b}" in text for b in {r["bench"] for r in json.loads(before)})


def test_a_timing_with_n_2_is_never_met(tmp_path: Path):
    rule = rules.rule_for(KILL)
    few = rules.judge(rule, _row(KILL, 7.0, n=2))
    assert (few.met, few.text) == (None, "not judged: n = 2 < 3")
    assert rules.judge(rule, _row(KILL, 7.0, n=3)).text == "yes"  # the same value, 3 runs
    # a row no rule names: its benchmark said "met" on 2 events; the report does not
    other = _row("detection, crash (goodput run)", 0.5, n=2, goal="<= 2 s", met=True)
    assert rules.judge_default(other).text == "not judged: n = 2 < 3"
    _, head = _render(tmp_path, [_row(KILL, 7.0, n=2, goal="<= 8 s", met=True)])
    cells = _headline(head, rule.goal)
    assert cells[2:4] == ["2", "not judged: n = 2 < 3"]


def test_a_missed_goal_stays_missed(tmp_path: Path):
    """A miss is "no" on any n, by the rule or by its benchmark's own comparison; no other
    reading recorded in the note (drift-scaled, paced) turns it into anything else."""
    rule = rules.rule_for(NOTICE)
    one = rules.judge(rule, _row(NOTICE, 18.6, n=1, note="drift-scaled: 14.0 s"))
    assert (one.met, one.text) == (False, "no (n = 1 < 3)")
    missed = _row("steps lost, crash (recovery run)", "11, 132", "steps", 2, met=False, goal="x")
    assert rules.judge(rules.rule_for(missed["name"]), missed).text == "no"
    assert rules.judge_default({**missed, "name": "steps lost, elsewhere"}).text == "no"
    rows = [_row(NOTICE, 18.6, goal="<= 8 s", met=False, note="drift-scaled 7.2 s"),
            _row(KILL, 7.0, goal="<= 8 s", met=True)]  # fmt: skip
    _, head = _render(tmp_path, rows)
    assert _headline(head, rule.goal)[3] == "no (1 of 2 rows)"  # one rule judges both kinds
    _, head = _render(tmp_path, rows[1:])
    assert _headline(head, rules.rule_for(KILL).goal)[3] == "yes"  # the positive control


def test_negative_control_a_figure_that_misses_its_rule_is_no(tmp_path: Path):
    """The module said met; the value misses the registered threshold: the report says no."""
    rows = [_row(NOTICE, 8.01, goal="<= 9 s", met=True)]
    text, head = _render(tmp_path, rows)
    assert _headline(head, rules.rule_for(NOTICE).goal)[1:4] == ["8.01 s", "3", "no"]
    section = text[text.index("## recovery") :]
    assert f"| {NOTICE} | 8.01 s | 3 |" in section and "| no |" in section


def test_unsupported_records_say_not_measured_and_goodput_is_googles(tmp_path: Path):
    short = {"name": "goodput, faults the VMs survive (crash, hang; P=300 s, 3 runs): productive "
             "/ wall, Google's definition", "value": "96.0 %", "unit": "", "n": 3,
             "bench": "goodput-survive", "note": "shorter or sparser than the goal's: 1 run(s) "
             "under 20 min"}  # fmt: skip
    cost = {
        "name": "cost v6e-8 (1b): $/Mtok spot vs on-demand",
        "value": "0.004 vs 0.01",
        "unit": "$/Mtok",
        "n": 1,
        "bench": "cost",
        "note": "ASSUMED: MFU 0.5 of the peak",
    }
    where = "(P=300 s, 33.0 min, 6 faults: 2 notice, 2 kill, 1 crash, 1 hang)"
    goodput = [{"name": f"badput breakdown {where}", "value": "productive 1837 s (92.7%), "
                "startup 38 s (1.9%)", "unit": "", "n": 6, "bench": "goodput"},
               {"name": f"goodput: reference with the same checkpoint policy / faulted wall "
                f"{where}", "value": "102.1%", "unit": "", "n": 3, "bench": "goodput",
                "goal": ">= 95%", "met": True}]  # fmt: skip
    _, head = _render(tmp_path, [short, cost, *goodput])
    for rule_key, shown in (("goodput-survive", "shorter or sparser"), ("cost-per-token",
                            "MFU of the named size on its TPU is assumed")):  # fmt: skip
        cells = _headline(head, next(r.goal for r in rules.RULES if r.key == rule_key))
        assert cells[3] == "not measured under this rule" and shown in cells[1]
    google = _headline(head, next(r.goal for r in rules.RULES if r.key == "goodput-google"))
    assert google[1].startswith("92.7 %") and "ours, reference-based: 102.1%" in google[1]
    assert google[2:4] == ["3", "no"]  # the runs' n, not the breakdown's 6 categories' events


def test_rules_are_data_with_unique_keys_and_the_report_subcommand_renders(tmp_path: Path):
    assert len({r.key for r in rules.RULES}) == len(rules.RULES) <= 30
    for rule in rules.RULES:
        re.compile(rule.figures)
        assert rule.op in {"<=", ">=", "<", "==", "bench", "none"} and rule.source
    md = tmp_path / "B.md"
    md.with_suffix(".json").write_text(json.dumps([_row(KILL, 7.0)]))
    assert main(["report", "--out", str(md)]) == 0
    assert json.loads(md.with_suffix(".json").read_text()) == [_row(KILL, 7.0)]
    assert "## Judging rules" in md.read_text()


def test_a_rerun_keeps_the_rows_it_replaces_in_the_history(tmp_path: Path):
    """A re-run of a benchmark replaces its rows in the JSON; each replaced row goes, unchanged, to
    BENCHMARKS.history.jsonl. Rows left as they were and other benchmarks' rows are not copied."""
    md = tmp_path / "BENCHMARKS.md"
    old = [_row(KILL, 38.7), _row(NOTICE, 38.4), _row("other", 1.0, bench="coldboot")]
    md.with_suffix(".json").write_text(json.dumps(old))
    history = report.history_path(md)
    report.write([report.Figure(KILL, 20.1, "s", n=3, bench="recovery")], md, replace="recovery")
    kept = json.loads(md.with_suffix(".json").read_text())
    assert {r["name"]: r["value"] for r in kept} == {KILL: 20.1, "other": 1.0}
    lines = [json.loads(ln) for ln in history.read_text().splitlines()]
    assert [(h["row"]["name"], h["row"]["value"]) for h in lines] == [(KILL, 38.7), (NOTICE, 38.4)]
    assert all(h["replaced_on"] and "replaced_by_commit" in h for h in lines)
    # A write that changes nothing adds nothing; a changed row without `replace` is kept too.
    report.write([report.Figure(KILL, 20.1, "s", n=3, bench="recovery")], md)
    assert len(history.read_text().splitlines()) == 2
    report.write([report.Figure(KILL, 19.0, "s", n=3, bench="recovery")], md)
    assert json.loads(history.read_text().splitlines()[-1])["row"]["value"] == 20.1
