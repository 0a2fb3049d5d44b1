"""The Fabric layer: every worker of a slice at once, over SSH, with retries.

One `ThreadingGroup` per call over persistent connections (on GCP through an IAP ProxyCommand or
internal IPs, loopback in the local pod). Transient SSH failures (connection errors, gcloud's exit
255) are retried with exponential backoff on the failed workers only.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

from fabric import Config, Connection, ThreadingGroup
from fabric.exceptions import GroupException

from ops.provider import Worker
from ops.recovery import Probe
from trainer.status import TrainerStatus

ROOT = '"${TPUPOD_ROOT:-/var/lib/tpupod}"'
TRAINERCTL = f"{ROOT}/current/bootstrap/trainerctl.sh"
SSH_EXIT = 255  # ssh / gcloud's own failure: retryable
# One round trip per worker: every file the recovery table needs, in sections.
PROBE_SCRIPT = f"""R={ROOT}
echo @@now; date +%s.%N
echo @@status; cat "$R/status.json" 2>/dev/null; echo
echo @@bootstrap; cat "$R/bootstrap.json" 2>/dev/null; echo
echo @@exit; cat "$R/trainer.exit" 2>/dev/null && date -r "$R/trainer.exit" +%s.%N 2>/dev/null
echo @@alive; if [ -f "$R/trainer.pid" ]; then p=$(cat "$R/trainer.pid")
  if [ -n "$p" ] && [ -d "/proc/$p" ]; then echo yes; else echo no; fi; fi
echo @@preempted; curl -sf -m 1 -H 'Metadata-Flavor: Google' \
 "http://${{GCE_METADATA_HOST:-metadata.google.internal}}/computeMetadata/v1/instance/preempted" \
 2>/dev/null; echo
echo @@end
"""


class WorkerError(Exception):
    """A command failed on some workers after all retries; the message names them."""


@dataclass
class Outcome:
    """One worker's result: `exited` is None when SSH itself failed (then `error` says why)."""

    index: int
    exited: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exited == 0


class WorkerGroup:
    """SSH to every worker; use as a context manager so no connection outlives the caller."""

    def __init__(
        self,
        workers: Iterable[Worker],
        *,
        retries: int = 3,
        backoff: float = 0.5,
        connect_timeout: float = 10.0,
        command_timeout: float = 60.0,
    ):
        self.workers = sorted(workers, key=lambda w: w.index)
        self.retries, self.backoff = retries, backoff
        self.command_timeout = command_timeout
        config = Config(overrides={"run": {"in_stream": False}, "load_ssh_configs": False})
        self.connections = {
            w.index: Connection(
                w.host,
                user=w.user,
                port=w.port,
                config=config,
                gateway=w.proxy_command,
                connect_timeout=connect_timeout,
                connect_kwargs=_connect_kwargs(w),
            )
            for w in self.workers
        }

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for cxn in self.connections.values():
            cxn.close()

    @property
    def indices(self) -> list[int]:
        return sorted(self.connections)

    def run(
        self, command: str, indices: Iterable[int] | None = None, timeout: float | None = None
    ) -> dict[int, Outcome]:
        """Runs `command` on the workers together; retries the ones whose SSH failed."""
        todo = list(self.indices if indices is None else indices)
        outcomes: dict[int, Outcome] = {}
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            for index, outcome in self._run_once(command, todo, timeout).items():
                outcomes[index] = outcome
            todo = [i for i in todo if _transient(outcomes[i])]
            for index in todo:  # a broken transport must not be reused
                self.connections[index].close()
            if not todo:
                break
        return outcomes

    def _run_once(self, command: str, indices: list[int], timeout: float | None):
        by_cxn = {self.connections[i]: i for i in indices}
        group = ThreadingGroup.from_connections(list(by_cxn))
        kwargs = {"hide": True, "warn": True, "timeout": timeout or self.command_timeout}
        try:
            results = group.run(command, **kwargs)
        except GroupException as err:
            results = err.result
        outcomes = {}
        for cxn, res in results.items():
            index = by_cxn[cxn]
            if isinstance(res, BaseException):
                outcomes[index] = Outcome(index, None, error=_describe(res))
            else:
                outcomes[index] = Outcome(index, res.exited, res.stdout, res.stderr)
        return outcomes

    def check(self, command: str, what: str, timeout: float | None = None) -> dict[int, Outcome]:
        """Like run, but every worker must succeed (else WorkerError naming the failures)."""
        outcomes = self.run(command, timeout=timeout)
        bad = [o for o in outcomes.values() if not o.ok]
        if bad:
            detail = "; ".join(
                f"worker {o.index}: {o.error or _last_line(o.stderr) or f'exit {o.exited}'}"
                for o in bad
            )
            raise WorkerError(f"{what} failed on {len(bad)} worker(s): {detail}")
        return outcomes

    # -- the trainer ---------------------------------------------------------------------------
    def trainerctl(
        self, verb: str, timeout: float | None = None, stop_timeout: float | None = None
    ) -> dict[int, Outcome]:
        """`stop_timeout`: seconds from SIGTERM to SIGKILL (a hung trainer never saves)."""
        env = f"TPUPOD_STOP_TIMEOUT={int(stop_timeout)} " if stop_timeout is not None else ""
        return self.check(f"{env}{TRAINERCTL} {verb}", f"trainerctl {verb}", timeout=timeout)

    def restart(self, stop_timeout: float = 120.0) -> None:
        """Stop on every worker, clear stale locks everywhere, then start everywhere: no worker
        may start while another still holds the old job's coordinator or TPU."""
        self.trainerctl("stop", timeout=stop_timeout)
        self.trainerctl("clear-locks")
        self.trainerctl("start")

    def probe(self) -> list[Probe]:
        outcomes = self.run(PROBE_SCRIPT, timeout=20.0)
        return [parse_probe(outcomes[i]) for i in self.indices]

    def read(self, path: str) -> dict[int, str | None]:
        """A file under $TPUPOD_ROOT on every worker (None where missing)."""
        outcomes = self.run(f'cat {ROOT}/"{path}"')
        return {i: (o.stdout if o.ok else None) for i, o in outcomes.items()}


def parse_probe(outcome: Outcome) -> Probe:
    """Turns PROBE_SCRIPT's sections into a Probe; a failed SSH is an unreachable worker."""
    if outcome.exited is None or "@@end" not in outcome.stdout:
        return Probe(
            outcome.index,
            reachable=False,
            error=outcome.error or _last_line(outcome.stderr) or f"exit {outcome.exited}",
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
    bootstrap = _json_or_none(text.get("bootstrap"))
    exit_lines = sections.get("exit", [])
    exit_code = _int_or_none(exit_lines[0]) if exit_lines else None
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


def _connect_kwargs(worker: Worker) -> dict:
    kwargs: dict = {"banner_timeout": 30, "auth_timeout": 30}
    if worker.key_filename:
        kwargs.update(key_filename=worker.key_filename, look_for_keys=False, allow_agent=False)
    return kwargs


def _transient(outcome: Outcome) -> bool:
    return outcome.exited is None or outcome.exited == SSH_EXIT


def _describe(err: BaseException) -> str:
    if isinstance(err, socket.timeout | TimeoutError):
        return "timed out"
    return f"{type(err).__name__}: {err}".strip().splitlines()[0][:200]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _json_or_none(text: str | None):
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _int_or_none(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None
