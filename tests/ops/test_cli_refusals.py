"""Every refusal at the CLI's doors is one line on stderr and exit 2: argparse's own (unknown
command, flag or value) and the commands' (bad input, an impossible request)."""

from __future__ import annotations

import pytest

from ops.cli import main

REFUSED = {
    "unknown command": ["nope"],
    "missing value": ["status", "--stack"],
    "bad value": ["local", "preempt", "--notice", "x"],
    "unknown flag": ["status", "--bogus"],
    "unknown stack": ["watch", "--stack", "nope"],
    "no job there": ["job", "check", "/nonexistent-job-dir"],
    "too few demo steps": ["demo", "--steps", "5"],
    "stockout count": ["local", "stockout", "--count", "0"],
    "fault rate": ["local", "storage-faults", "--rate", "2"],
    "negative notice": ["local", "preempt", "--notice", "-1"],
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_refusal_is_one_line_and_exit_2(case, capsys, tmp_path):
    argv = REFUSED[case]
    if argv[0] == "local" and "--pod-dir" not in argv:
        argv = [*argv, "--pod-dir", str(tmp_path)]  # no pod there: refused before it matters
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's refusals exit from parse_args
        code = exit_.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and out == "", (code, err)
    assert lines[0].startswith("tpupod"), lines
