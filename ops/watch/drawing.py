"""docs/recovery-table.md: the recovery table (ops.watch.transitions), what each waiting phase observes,
and the deadline of each thing watch waits on, with its value on GCP and on the local pod, all
read from the definitions (ops.watch.conditions, ops.watch.deadlines); a test keeps it current."""

from __future__ import annotations

from ops.cloud import queued
from ops.watch.conditions import NOTICE_HEALTH, SLICE_ACTIONS, STATE_DEADLINES, SliceAction
from ops.watch.deadlines import REQUEST_LIMITS, WatchConfig, config_for
from ops.watch.transitions import TABLE, WAITS_FOR

NOTES = {"UNKNOWN": " (Google's: after a failed repair)",
         "UNRECOGNIZED": " (a state the installed client cannot name)"}  # fmt: skip


def markdown() -> str:
    lines = [
        "# The recovery table",
        "",
        "Generated from `ops/watch/transitions.py` by `uv run python -m ops.watch > "
        "docs/recovery-table.md`; every transition `tpupod watch` makes is one of these rows "
        "(journaled as a `transition` event). A (phase, event) pair not listed changes nothing.",
        "",
        "| phase | event | next phase | action |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {p} | {e} | {to} | {a} |" for (p, e), (to, a) in TABLE.items()]
    lines += ["", "What each waiting phase observes:", "", "| phase | observes |", "| --- | --- |"]
    lines += [f"| {p} | {what} |" for p, what in WAITS_FOR.items()]
    return "\n".join(lines + deadlines()) + "\n"


def deadlines() -> list[str]:
    """The named deadline of each node state and queued-resource state watch waits on."""
    gcp, local = WatchConfig(), config_for("local")

    def row(what: str, name: str) -> str:
        return f"| {what} | `{name}` | {gcp.limit(name):g} | {local.limit(name):g} |"

    lines = [
        "",
        "The deadlines (seconds; `ops/watch/deadlines.py`) of the node states a judged phase "
        "waits on, and of a recreated node awaited READY (past it the slice counts as lost and "
        "is recreated; `unknown-state` is "
        "journaled once when a state has a deadline of its own), and of a queued resource's "
        "states (past it the request is filed again):",
        "",
        "| waited on | deadline | GCP | local pod |",
        "| --- | --- | --- | --- |",
    ]
    waits = [s for s, action in SLICE_ACTIONS.items() if action is SliceAction.WAIT]
    lines += [row(f"node {s}{NOTES.get(s, '')}", "limits." + STATE_DEADLINES.get(s, "transient"))
              for s in waits]  # fmt: skip
    for health in NOTICE_HEALTH:
        lines.append(row(f"node READY, {health}, spot (one in-place restart first)",
                         "limits.spot_maintenance"))  # fmt: skip
        lines.append(row(f"node READY, {health}, on-demand or reserved", "limits.transient"))
    lines.append(row(f"queued resource {queued.WAITING}, with another zone to try",
                     "zone_patience"))  # fmt: skip
    lines += [row(f"queued resource {state}{NOTES.get(state, '')}", name)
              for state, name in REQUEST_LIMITS.items()]  # fmt: skip
    lines.append(row("queued resource, any other state", "operation_deadline"))
    return lines
