"""How each worker's job started (ops.fleet.starts), from `jobctl start`'s own words: the
restart's journal line and `tpupod restart` name the workers that used their standby and why
any was refused; a job with no standby gets no clause. The words are checked against the
scripts that say them, so a rewording there cannot silence this."""

from __future__ import annotations

from infra.bundle_archive import PROJECT_ROOT
from ops.fleet.outcome import Outcome
from ops.fleet.starts import PROMOTED, REFUSED, starts

WARM = "job started (pid 41, attempt 3): the standby\n"
COLD = "job started (pid 52, attempt 3)\n"
WHY = "standby refused: the environment differs in LANG"


def test_warm_and_refused_starts_are_named():
    how = starts({0: Outcome(0, 0, WARM), 1: Outcome(1, 0, COLD, f"{WHY}\n")})
    assert how.promoted == [0] and how.refused == {1: WHY}
    assert how.text() == f", 1 of 2 from their standby; worker 1 cold ({WHY})"
    assert how.fields() == {"standby": {"promoted": [0], "refused": {"1": WHY}}}
    every = starts({0: Outcome(0, 0, WARM), 1: Outcome(1, 0, WARM)})
    assert every.text() == ", 2 of 2 from their standby" and every.refused == {}


def test_a_job_without_a_standby_gets_no_clause():
    how = starts({0: Outcome(0, 0, COLD), 1: Outcome(1, 0, COLD)})
    assert (how.text(), how.fields()) == ("", {})


def test_the_words_are_jobctls():
    scripts = "".join(p.read_text() for p in (PROJECT_ROOT / "bootstrap").glob("jobctl*.sh"))
    assert f'attempt $(cat "$ATTEMPTFILE" 2>/dev/null || echo 1){PROMOTED}"' in scripts
    assert f'echo "{REFUSED}$(cat "$ROOT/standby.refused")" >&2' in scripts
