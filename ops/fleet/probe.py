"""A worker's probe: one SSH round trip that prints every file the recovery table needs, in
`@@section` blocks, and its parse into a `Probe` (ops.fleet.workers runs it on every worker)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from contract.status import JobStatus, parse_status
from ops.fleet.outcome import Outcome

# mtime <path>: the file's modification time, empty when it is missing.
_SECTIONS = """mt() { date -r "$1" +%s.%N 2>/dev/null || true; }
echo @@now; date +%s.%N
echo @@status; cat "$R/status.json" 2>/dev/null; echo
echo @@status_mtime; mt "$R/status.json"
echo @@bootstrap; cat "$R/bootstrap.json" 2>/dev/null; echo
echo @@exit; cat "$R/job.exit" 2>/dev/null && mt "$R/job.exit"
echo @@last_exit; cat "$R/job.last-exit" 2>/dev/null
echo @@term; cat "$R/job.term" 2>/dev/null
echo @@attempt; cat "$R/job.attempt" 2>/dev/null
echo @@alive; if [ -f "$R/job.pid" ]; then p=$(cat "$R/job.pid")
  if [ -n "$p" ] && [ -d "/proc/$p" ]; then echo yes; else echo no; fi; fi
echo @@preempted; curl -sf -m 1 -H 'Metadata-Flavor: Google' \\
 "http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/instance/preempted" \\
 2>/dev/null; echo
echo @@end
"""


@dataclass
class Probe:
    """What one SSH round trip tells about a worker; `now` is the worker's clock."""

    index: int
    reachable: bool = True
    error: str | None = None
    bootstrap: dict | None = None
    status: JobStatus | None = None
    exit_code: int | None = None
    exit_mtime: float | None = None
    alive: bool | None = None
    preempted_flag: bool = False  # metadata instance/preempted
    last_exit: int | None = None  # the previous attempt's exit code on this worker
    term_at: float | None = None  # when the job's group last got a SIGTERM (job.term)
    attempt: int | None = None  # the attempt this worker runs (job.attempt)
    now: float = 0.0
    progress_age: float = 0.0  # seconds since the slice's progress last changed (watcher)
    step_limit: float | None = None  # the step clock's hang limit (ops.watch.step_clock), if any

    @property
    def bootstrap_state(self) -> str | None:
        return (self.bootstrap or {}).get("state")

    @property
    def bootstrap_bundle(self) -> str | None:
        """The code bundle this worker's last bootstrap installed (bootstrap.json)."""
        return (self.bootstrap or {}).get("bundle_sha256")

    @property
    def heartbeat_age(self) -> float | None:
        beat = None if self.status is None else self.status.heartbeat
        return None if beat is None else max(0.0, self.now - beat)

    def current(self, since: float) -> JobStatus | None:
        """The status of the job started at `since` or later (older files are a dead job's)."""
        return self.status if self.status and self.status.updated >= since else None

    def noticed(self, since: float) -> bool:
        """A preemption notice, or a SIGTERM to the job's group, since the job started."""
        return self.preempted_flag or (self.term_at is not None and self.term_at >= since)


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
    mtime = float_or_none(text.get("status_mtime", ""))
    status = parse_status(text["status"], mtime) if text.get("status") else None
    bootstrap = json_or_none(text.get("bootstrap"))
    exit_lines = sections.get("exit", [])
    exit_code = int_or_none(exit_lines[0]) if exit_lines else None
    exit_mtime = float_or_none(exit_lines[1]) if len(exit_lines) > 1 else None
    alive = {"yes": True, "no": False}.get(text.get("alive", ""))
    return Probe(
        outcome.index,
        bootstrap=bootstrap if isinstance(bootstrap, dict) else None,
        status=status,
        exit_code=exit_code,
        exit_mtime=exit_mtime,
        alive=alive,
        preempted_flag=text.get("preempted", "").upper() == "TRUE",
        last_exit=int_or_none(text.get("last_exit", "")),
        term_at=float_or_none(text.get("term", "")),
        attempt=int_or_none(text.get("attempt", "")),
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


def float_or_none(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None
