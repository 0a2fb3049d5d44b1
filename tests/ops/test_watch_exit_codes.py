"""The watcher's service restarts `tpupod watch` after anything but the two ends of a run: the
unit's (and its no-systemd supervisor's) rule matches watch's exit codes. 1, Python's own code
for an uncaught exception, must restart: a bug in the watcher must not end recovery."""

from __future__ import annotations

import re
from pathlib import Path

from ops.watch import EXIT_DONE, EXIT_GAVE_UP

BOOTSTRAP = Path(__file__).resolve().parents[2] / "bootstrap"


def test_the_units_restart_rule_matches_watchs_exit_codes():
    unit = (BOOTSTRAP / "tpupod-watcher.service").read_text()
    rule = re.search(r"^RestartPreventExitStatus=(.*)$", unit, re.MULTILINE)
    prevented = {int(code) for code in rule.group(1).split()}
    assert prevented == {EXIT_DONE, EXIT_GAVE_UP}
    assert 1 not in prevented and re.search(r"^Restart=always$", unit, re.MULTILINE)
    supervisor = (BOOTSTRAP / "watcher-startup.sh").read_text()
    ends = re.search(r'case "\$rc" in ([0-9 |]+)\) return', supervisor)
    assert {int(c) for c in ends.group(1).replace("|", " ").split()} == prevented
