"""The Fabric layer: every worker of a slice at once, over SSH, with retries.

One `ThreadingGroup` per call over persistent connections, like `gcloud compute tpus tpu-vm ssh`:
through an IAP ProxyCommand to each worker's instance name, or to its internal IP. Host keys are
pinned to the ones the TPU API publishes in guest attributes (paramiko's RejectPolicy: an unknown
or different key is refused). Commands that change state run as root through `sudo -n` when the
login user is not root, as on a TPU VM. Transient SSH failures (connection errors, gcloud's exit
255) are retried with exponential backoff on the failed workers only.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterable

from fabric import Config, ThreadingGroup
from fabric.exceptions import GroupException

from ops.cloud.slice import Worker
from ops.fleet.outcome import Outcome
from ops.fleet.probe import Probe, last_line, parse_probe, probe_script
from ops.fleet.ssh_connections import (
    BoundedConnection,
    close_connections,
    connect_kwargs,
    describe_error,
    host_key_refused,
    pinned,
)

ROOT = '"${TPUPOD_ROOT:-/var/lib/tpupod}"'
# jobctl as root: directly when the login is root, else through passwordless sudo.
SUDO_JOBCTL = (
    'R={root}; if [ "$(id -u)" = 0 ]; then AS=; else AS="sudo -n"; fi; '
    '$AS env TPUPOD_ROOT="$R" {env}"$R/current/bootstrap/jobctl.sh" {verb}'
)
# A worker's job stopped and its stale locks cleared, in one round trip (each worker's clear
# needs only its own stop); a start waits until every worker has done both.
STOP_AND_CLEAR = "stop clear-locks"
# Any script as root, the same way (`bash -c`, the script quoted once).
AS_ROOT = (
    'R={root}; if [ "$(id -u)" = 0 ]; then AS=; else AS="sudo -n"; fi; '
    '$AS env TPUPOD_ROOT="$R" bash -c {script}'
)
# The startup script again, as root, as at boot: fetched from the metadata server (where `pulumi
# up` or nodes.patch put the current one) to a file, then run. It stops a job of another bundle,
# fetches and verifies the node's bundle, syncs its environment and starts the job.
RERUN_STARTUP = (
    'R={root}; M="${{GCE_METADATA_HOST:-metadata.google.internal}}"; '
    'if [ "$(id -u)" = 0 ]; then AS=; else AS="sudo -n"; fi; '
    '$AS env TPUPOD_ROOT="$R" GCE_METADATA_HOST="$M" bash -c {script}'
)
RERUN_SCRIPT = (
    'set -e; d="$TPUPOD_ROOT/.bootstrap"; mkdir -p "$d"; '
    "curl -sf -H 'Metadata-Flavor: Google' -o \"$d/startup-script.sh\" "
    '"http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/startup-script"; '
    'bash "$d/startup-script.sh"'
)
SUDO_REFUSED = (
    "worker {index}: user {user} cannot run jobctl as root (passwordless sudo refused); "
    "grant roles/compute.osAdminLogin (OS Login) or add {user} to sudoers"
)
SSH_EXIT = 255  # ssh / gcloud's own failure: retryable
PROBE_SCRIPT = probe_script(ROOT)


class WorkerError(Exception):
    """A command failed on some workers after all retries; the message names them."""


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
        self.by_index = {w.index: w for w in self.workers}
        self.connections = {
            w.index: pinned(
                BoundedConnection(
                    w.host,
                    user=w.user,
                    port=w.port,
                    config=config,
                    gateway=w.proxy_command,
                    connect_timeout=connect_timeout,
                    connect_kwargs=connect_kwargs(w, connect_timeout),
                ),
                w,
            )
            for w in self.workers
        }

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        close_connections(*self.connections.values())

    @property
    def indices(self) -> list[int]:
        return sorted(self.connections)

    def run(
        self,
        command: str,
        indices: Iterable[int] | None = None,
        timeout: float | None = None,
        retries: int | None = None,
    ) -> dict[int, Outcome]:
        """Runs `command` on the workers together; retries the ones whose SSH failed."""
        todo = list(self.indices if indices is None else indices)
        outcomes: dict[int, Outcome] = {}
        for attempt in range((self.retries if retries is None else retries) + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            for index, outcome in self._run_once(command, todo, timeout).items():
                outcomes[index] = outcome
            todo = [i for i in todo if _transient(outcomes[i])]
            # a broken transport must not be reused
            close_connections(*(self.connections[index] for index in todo))
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
                worker = self.by_index[index]
                fatal = host_key_refused(res)
                outcomes[index] = Outcome(
                    index, None, error=describe_error(res, worker), fatal=fatal
                )
            else:
                outcomes[index] = Outcome(index, res.exited, res.stdout, res.stderr)
        return outcomes

    def check(self, command: str, what: str, timeout: float | None = None) -> dict[int, Outcome]:
        """Like run, but every worker must succeed (else WorkerError naming the failures)."""
        return self._checked(self.run(command, timeout=timeout), what)

    @staticmethod
    def _checked(outcomes: dict[int, Outcome], what: str) -> dict[int, Outcome]:
        bad = [o for o in outcomes.values() if not o.ok]
        if bad:
            detail = "; ".join(
                f"worker {o.index}: {o.error or last_line(o.stderr) or f'exit {o.exited}'}"
                for o in bad
            )
            raise WorkerError(f"{what} failed on {len(bad)} worker(s): {detail}")
        return outcomes

    # -- the job -------------------------------------------------------------------------------
    def jobctl(
        self,
        verb: str,
        timeout: float | None = None,
        stop_timeout: float | None = None,
        attempt: int | None = None,
        keep_standby: bool = False,
    ) -> dict[int, Outcome]:
        """As root (the job's unit is root's); `verb`: one, or several in turn ("stop
        clear-locks": one round trip, each worker's next verb only after its last succeeded);
        `stop_timeout`: seconds from SIGTERM to SIGKILL (default: the job's grace_s; a hung job
        never saves); `attempt`: the attempt `start` begins; `keep_standby`: a stop that a start
        of the same bundle follows keeps the parked next attempt (a job with `standby:`). A
        refused sudo is one line naming the fix."""
        command = " && ".join(
            jobctl_command(
                v,
                stop_timeout if v == "stop" else None,
                attempt if v == "start" else None,
                keep_standby=keep_standby and v == "stop",
            )  # fmt: skip
            for v in verb.split()
        )
        outcomes = self.run(command, timeout=timeout)
        refused = [o for o in outcomes.values() if not o.ok and sudo_refused(o.stderr)]
        if refused:
            o = refused[0]
            user = self.by_index[o.index].user or "the login user"
            raise WorkerError(SUDO_REFUSED.format(index=o.index, user=user))
        return self._checked(outcomes, f"jobctl {verb}")

    def restart(self, attempt: int | None = None,
                stop_timeout: float | None = None) -> dict[int, Outcome]:  # fmt: skip
        """Stop and clear stale locks on every worker, then start everywhere: no worker may
        start while another still holds the old job's coordinator or TPU. The starts' outcomes
        (ops.fleet.starts reads which came from a standby)."""
        self.jobctl(STOP_AND_CLEAR, timeout=(stop_timeout or 600.0) + 60.0,
                    stop_timeout=stop_timeout, keep_standby=True)  # fmt: skip
        return self.jobctl("start", attempt=attempt)

    def roll_out(self, timeout: float, before_start: Callable[[], None] | None = None) -> None:
        """The node's bundle onto these workers: stop the job (SIGTERM: it saves, as for a
        preemption), clear stale locks, then every worker's startup script again, together
        (it fetches and verifies the bundle, syncs its environment, starts the job)."""
        self.jobctl(STOP_AND_CLEAR, timeout=None)
        if before_start is not None:
            before_start()
        command = RERUN_STARTUP.format(root=ROOT, script=shlex.quote(RERUN_SCRIPT))
        self._checked(self.run(command, timeout=timeout), "startup script")

    def probe(self) -> list[Probe]:
        """One look at every worker, retried once: the next poll looks again, and a worker
        that stays unreachable has a deadline of its own (ops.watch.deadlines), so a worker
        that vanished mid-probe costs the watch seconds, not minutes."""
        outcomes = self.run(PROBE_SCRIPT, timeout=20.0, retries=min(self.retries, 1))
        return [parse_probe(outcomes[i]) for i in self.indices]

    def read(self, path: str) -> dict[int, str | None]:
        """A file under $TPUPOD_ROOT on every worker (None where missing)."""
        outcomes = self.run(f'cat {ROOT}/"{path}"')
        return {i: (o.stdout if o.ok else None) for i, o in outcomes.items()}


def jobctl_command(verb: str, stop_timeout: float | None = None, attempt: int | None = None,
                   keep_standby: bool = False) -> str:  # fmt: skip
    env = f"TPUPOD_STOP_TIMEOUT={int(stop_timeout)} " if stop_timeout is not None else ""
    env += f"TPUPOD_ATTEMPT={int(attempt)} " if attempt is not None else ""
    env += "TPUPOD_KEEP_STANDBY=1 " if keep_standby else ""
    return SUDO_JOBCTL.format(root=ROOT, env=env, verb=verb)


def as_root(script: str) -> str:
    """`script` run by bash as root on the worker: directly as root, else through `sudo -n`."""
    return AS_ROOT.format(root=ROOT, script=shlex.quote(script))


def sudo_refused(stderr: str) -> bool:
    """sudo's own refusals ("sudo: a password is required", "...: sudo: command not found")."""
    return any(
        line.startswith("sudo:") or line.endswith("sudo: command not found")
        for line in (ln.strip() for ln in (stderr or "").splitlines())
    )


def _transient(outcome: Outcome) -> bool:
    return not outcome.fatal and (outcome.exited is None or outcome.exited == SSH_EXIT)
