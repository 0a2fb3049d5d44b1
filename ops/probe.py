"""A worker's probe: one SSH round trip that prints every file the recovery table needs, in
`@@section` blocks, and its parse into a `Probe` (ops.workers runs it on every worker)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from ops.recovery import Probe
from trainer.status import TrainerStatus

if TYPE_CHECKING:
    from ops.workers import Outcome

_SECTIONS = """echo @@now; date +%s.%N
echo @@status; cat "$R/status.json" 2>/dev/null; echo
echo @@bootstrap; cat "$R/bootstrap.json" 2>/dev/null; echo
echo @@exit; cat "$R/trainer.exit" 2>/dev/null && date -r "$R/trainer.exit" +%s.%N 2>/dev/null
echo @@alive; if [ -f "$R/trainer.pid" ]; then p=$(cat "$R/trainer.pid")
  if [ -n "$p" ] && [ -d "/proc/$p" ]; then echo yes; else echo no; fi; fi
echo @@preempted; curl -sf -m 1 -H 'Metadata-Flavor: Google' \
 "http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/instance/preempted" \
 2>/dev/null; echo
echo @@end
"""


def probe_script(root: str) -> str:
    """The probe for a worker whose tpupod root is the shell expression `root`."""
    return f"R={root}\n" + _SECTIONS


def parse_probe(outcome: Outcome) -> Probe:
    """Turns the probe's sections into a Probe; a failed SSH is an unreachable worker."""
    if outcome.exited is None or "@@end" not in outcome.stdout:
        return Probe(
            outcome.index,
            reachable=False,
            error=outcome.error or last_line(outcome.stderr) or f"exit {outcome.exited}",
        )
    sections: dict[str, list[str]] = {}
    current = None
    for line in outcome.stdout.splitlines():
        if line.startswith("@@"):
            current = line[2:].strip()
            sections[current] = []
        elif current is not None and line.strip():
            sections[current].append(line.strip())
    text = {k: "\n".join(v) for k, v in sections.items()}
    status = None
    if text.get("status"):
        try:
            status = TrainerStatus.from_json(text["status"])
        except (ValueError, TypeError):
            status = None  # torn or from a newer trainer: judged as "no status yet"
    bootstrap = json_or_none(text.get("bootstrap"))
    exit_lines = sections.get("exit", [])
    exit_code = int_or_none(exit_lines[0]) if exit_lines else None
    exit_mtime = float(exit_lines[1]) if len(exit_lines) > 1 else None
    alive = {"yes": True, "no": False}.get(text.get("alive", ""))
    return Probe(
        outcome.index,
        bootstrap=bootstrap if isinstance(bootstrap, dict) else None,
        status=status,
        exit_code=exit_code,
        exit_mtime=exit_mtime,
        alive=alive,
        preempted_flag=text.get("preempted", "").upper() == "TRUE",
        now=float(text.get("now") or time.time()),
    )


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def json_or_none(text: str | None):
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def int_or_none(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None
