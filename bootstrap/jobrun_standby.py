"""The launcher's standby mode (`jobrun.py standby`, docs/proposals/standby-interpreter.md): the
job's next attempt parked with its imports done (tpupod_job.standby, the interpreter's side),
promoted by `jobctl start` (SIGUSR1 and standby.go) after checking that nothing it was made from
changed, then supervised as jobrun's `run` supervises a cold start. `jr` is the running jobrun
module (its files, Attempt and supervise), handed over rather than imported a second time.

Stdlib only: the launcher runs isolated (`python -I -S`)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import threading

from bootstrap.jobkit.tpupod_job.standby import FD, OWN, PRELOAD, PREPARE
from contract import runline

STANDBY_JSON, STANDBY_GO, STANDBY_REFUSED = "standby.json", "standby.go", "standby.refused"
# Who called jobctl, not what the job runs with: these may differ between the parked
# environment and the attempt's (TPUPOD_ATTEMPT is the go's to set).
# systemd's marks of the unit a process runs in (its own, never a caller's).
UNIT_MARKS = ("INVOCATION_ID", "JOURNAL_STREAM")
NOISE = {"_", "SHLVL", "PWD", "OLDPWD", *UNIT_MARKS, "TPUPOD_ATTEMPT", "TPUPOD_STOP_TIMEOUT",
         "TPUPOD_KEEP_STANDBY"}  # fmt: skip
NOISE_PREFIXES = ("SUDO_", "SSH_", "MD_", "BASH_FUNC_")


def standby_key(jr) -> list:
    """What a parked attempt was made from: the bundle and the bootstrap's files."""
    files = []
    for name in ("job.json", "job.env", "job.venv"):
        with open(jr.path(name), "rb") as f:
            files.append(base64.b64encode(f.read()).decode())
    return [os.path.realpath(jr.path("current")), *files]


def differing(parked: dict, wanted: dict) -> list[str]:
    """The names (never the values) whose value differs, noise aside."""
    names = (parked.keys() | wanted.keys()) - NOISE - set(OWN)
    return sorted(n for n in names
                  if not n.startswith(NOISE_PREFIXES) and parked.get(n) != wanted.get(n))  # fmt: skip


def park(jr) -> int:
    """`jobrun.py standby`: the job's next attempt, its imports under way, waiting for `jobctl
    start` (SIGUSR1 and standby.go); promoted, this launcher supervises it as `run` would. It
    can be promoted from its start (standby.json names it at once): one promoted while still
    importing goes on at full priority and runs the job once its imports are done, which is
    never later than a cold start would (issue 50: faults that come soon after a start)."""
    attempt = jr.Attempt()
    standby = attempt.spec.get("standby")
    if not standby or attempt.spec.get("secrets"):
        return 0
    attempt.number = jr.current_attempt() + 1  # a guess: the go sets the real one
    parked, key = attempt.environment(), standby_key(jr)
    ours, theirs = socket.socketpair()
    env = {**parked, FD: str(theirs.fileno()), PRELOAD: ",".join(standby.get("preload") or ()),
           PREPARE: standby.get("prepare") or ""}  # fmt: skip
    os.makedirs(jr.path("logs"), exist_ok=True)
    with open(jr.path("logs/standby.log"), "ab") as log:
        child = subprocess.Popen([os.path.join(attempt.venv, "bin", "python"), "-m",
                                  "tpupod_job.standby"], cwd=attempt.job_dir, env=env,
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 pass_fds=(theirs.fileno(),), preexec_fn=_lowest)  # fmt: skip
    theirs.close()
    promoted = threading.Event()
    signal.signal(signal.SIGUSR1, lambda signum, frame: promoted.set())
    reader = ours.makefile("rb")
    ready = _await_promotion(jr, child, reader, promoted)
    if ready is None:  # the preload failed (its log says why), or the child died parked
        _discard(jr, child)
        return 1
    attempt, wanted, why = _promotion(jr, parked, key)
    if why:
        jr.write_atomic(jr.path(STANDBY_REFUSED), f"{why}\n")
        _discard(jr, child)
        return 0
    output = attempt.begin()
    jr.write_atomic(jr.path("job.pid"), f"{os.getpid()}\n")
    _renice(child.pid)
    os.unlink(jr.path(STANDBY_JSON))
    if not ready:
        output.note(f"promoted the standby (pid {child.pid}) while it imports: at full priority")
        if not reader.readline():  # its preload failed, or a stop came first
            return _cold(jr, attempt, output, wanted, child)
    line = runline.parse(attempt.spec["run"])
    go = {"base": env, "env": wanted, "log": attempt.log, "args": list(line.args),
          "module": line.module, "script": line.script}  # fmt: skip
    ours.sendall(json.dumps({"go": go}).encode() + b"\n")
    output.note(f"promoted the standby (pid {child.pid}): its imports done")
    return jr.supervise(attempt, output, child)


def _await_promotion(jr, child, reader, promoted: threading.Event) -> bool | None:
    """Until SIGUSR1: True when the child parked first (standby.json then says so), False when
    it is still importing; None when it died first."""
    ready = False
    _announce(jr, child, ready)
    while not promoted.is_set():
        if child.poll() is not None:
            return None
        if ready:
            promoted.wait(0.1)
        elif select.select([reader], [], [], 0.1)[0]:
            if not reader.readline():
                return None
            ready = True
            _announce(jr, child, ready)
    return ready


def _announce(jr, child, parked: bool) -> None:
    jr.write_atomic(jr.path(STANDBY_JSON),
                    json.dumps({"pid": os.getpid(), "child": child.pid, "parked": parked}))  # fmt: skip


def _cold(jr, attempt, output, wanted: dict, child) -> int:
    """A standby promoted while importing whose imports failed: the attempt starts cold, as
    `run` starts it (a standby has no secrets). After a stop it ends as the stop asked."""
    code = jr.exit_code(child.wait())
    if attempt.termed.is_set():
        output.note(f"stopped before the standby's imports were done ({code})")
        output.close()
        return jr.finish(None, code)
    output.note(f"the standby's imports failed ({code}: logs/standby.log): a cold start")
    return jr.supervise(attempt, output, jr.launch(attempt, wanted))


def _as_caller(jr) -> str | None:
    """Takes the environment of the `jobctl start` that promotes it (standby.go: the one a cold
    launcher would start with) as this process's own, but for the marks of the unit it runs in
    (a cold launcher has its own unit's: the journal echo follows them); why not, if it cannot."""
    try:
        with open(jr.path(STANDBY_GO), "rb") as f:
            raw = f.read()
        os.unlink(jr.path(STANDBY_GO))
    except OSError as err:
        return f"no {STANDBY_GO} ({err})"
    caller = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    own = {name: os.environ[name] for name in UNIT_MARKS if name in os.environ}
    os.environ.clear()
    os.environ.update({k.decode(): v.decode() for k, v in caller.items()})
    for name in UNIT_MARKS:
        os.environ.pop(name, None)
    os.environ.update(own)
    return None


def _promotion(jr, parked: dict, key: list) -> tuple:
    """(the attempt a cold start would begin now, its environment, None), or (None, None, why
    the parked one cannot be it)."""
    why = _as_caller(jr)
    if why is None and standby_key(jr) != key:
        why = "the bundle or the bootstrap's files changed since it parked"
    if why:
        return None, None, why
    attempt = jr.Attempt()
    wanted = attempt.environment()
    names = differing(parked, wanted)
    return attempt, wanted, f"the environment differs in {', '.join(names)}" if names else None


def _discard(jr, child) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    child.wait()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(jr.path(STANDBY_JSON))


def _lowest() -> None:
    """The parked imports at the lowest priority, where it can be undone (root only)."""
    if os.geteuid() == 0:
        os.nice(19)


def _renice(pid: int) -> None:
    """Every thread of the promoted child (nice is per thread) at the priority a cold start's
    child would inherit: this launcher's own."""
    if os.geteuid() != 0:
        return
    own = os.getpriority(os.PRIO_PROCESS, 0)
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(task), own)
