"""The parked side of a standby interpreter (docs/proposals/standby-interpreter.md, section 3):
the job's next attempt, started while the job still runs, with its libraries already imported.

The launcher starts `VENV/bin/python -m tpupod_job.standby` in the job directory, with the job's
environment as a cold start would have it, stdin /dev/null, output to the standby's log, and one
end of a socketpair as fd `$TPUPOD_STANDBY_FD`. Here, in order:
1. the job's `prepare` hook ("module:function", `$TPUPOD_STANDBY_PREPARE`) may return the
   variables the interpreter must start with (the built-in trainer's allocator): then one
   re-exec with them, same pid, same fd;
2. every module of `$TPUPOD_STANDBY_PRELOAD` (comma-separated) is imported; one that fails,
   or imports that leave the accelerator open (a TPU's device files, libtpu's lockfile: the
   running job's), end the standby (the launcher starts cold);
3. one line `{"parked": ...}` on the socket, then a wait for `{"go": ...}`. The socket's end
   before a go (the launcher gone, the standby discarded) exits at once.
At the go the job also finds `$TPUPOD_STANDBY_PROMOTED_AT`, the time of its promotion.

At the go, the job runs in this process as `python -m MODULE ARGS` (or `python SCRIPT ARGS`)
would run it: output onto the attempt's log (fds 1 and 2), the environment changed by the
difference between the one this interpreter started with and the attempt's (what imports wrote
stays, as in a cold start), a fresh `__main__`, and the module run by runpy's own `-m` path.
SystemExit and exceptions leave as from a cold start, so the exit code is the job's.

Stdlib only; no JAX here: the preload list names what to import.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import socket
import sys
import time
import types

FD, PRELOAD, PREPARE = "TPUPOD_STANDBY_FD", "TPUPOD_STANDBY_PRELOAD", "TPUPOD_STANDBY_PREPARE"
PREPARED = "TPUPOD_STANDBY_PREPARED"  # set across the one re-exec of step 1
# Ours: never part of the job's environment, removed before the job runs.
OWN = (FD, PRELOAD, PREPARE, PREPARED)
# Set at the go, for the job: when it was promoted (unix s). Its process started when it parked,
# so /proc's start time is not when this attempt began (the built-in trainer reports both).
PROMOTED_AT = "TPUPOD_STANDBY_PROMOTED_AT"
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"  # libtpu's; jobctl.sh's LOCKFILE default (tested equal)


def prepare(environ: dict) -> dict | None:
    """Step 1: the environment to re-exec with, or None (no hook, or it keeps this one)."""
    hook = environ.get(PREPARE)
    if not hook or environ.get(PREPARED):
        return None
    module, _, function = hook.partition(":")
    wanted = getattr(importlib.import_module(module), function)(dict(environ))
    return None if wanted is None else {**wanted, PREPARED: "1"}


def preload(names: str) -> float:
    """Step 2: imports every named module; their seconds."""
    started = time.perf_counter()
    for name in filter(None, (n.strip() for n in names.split(","))):
        importlib.import_module(name)
    return time.perf_counter() - started


def accelerator_held(environ=os.environ) -> list[str]:
    """What of the running job's accelerator this interpreter holds open: a TPU's device files
    (/dev/accel*, /dev/vfio/*) or libtpu's lockfile. Importing JAX, Flax, Optax, Orbax or grain
    opens none (the backend starts at the first computation); a preload that does would contend
    with the job it stands by for, so it does not park."""
    lock = environ.get("TPUPOD_LIBTPU_LOCKFILE", LIBTPU_LOCKFILE)
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own fd, gone
            continue
        if target.startswith(("/dev/accel", "/dev/vfio/")) or target == lock:
            held.add(target)
    return sorted(held)


def apply_difference(base: dict, wanted: dict, environ=os.environ) -> None:
    """The attempt's environment as a diff on this one: what changed from `base` (what this
    interpreter started with) is set, what went is unset; the rest stays as imports left it."""
    for name in base.keys() - wanted.keys():
        environ.pop(name, None)
    for name, value in wanted.items():
        if base.get(name) != value:
            environ[name] = value
    for name in OWN:
        environ.pop(name, None)


def run_job(go: dict) -> None:
    """The go: the attempt's log on fds 1 and 2, its environment, a fresh __main__, then the
    module or script as the interpreter runs it (this returns only if the job does)."""
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(go["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    apply_difference(go["base"], go["env"])
    os.environ[PROMOTED_AT] = f"{time.time():.3f}"
    sys.modules["__main__"] = types.ModuleType("__main__")
    if go.get("module"):
        sys.argv = ["-m", *go["args"]]
        runpy._run_module_as_main(go["module"], alter_argv=True)  # the `-m` path itself
    else:
        script = go["script"]
        sys.argv = [script, *go["args"]]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


def main() -> int:
    wanted = prepare(os.environ)
    if wanted is not None:  # same pid, same fd (inheritable), the hook's variables
        os.set_inheritable(int(os.environ[FD]), True)
        os.execve(sys.executable, [sys.executable, "-m", "tpupod_job.standby"], wanted)
    control = socket.socket(fileno=int(os.environ[FD]))
    seconds = preload(os.environ.get(PRELOAD, ""))
    if held := accelerator_held():
        raise SystemExit(f"standby: its imports opened {', '.join(held)}, the running job's "
                         "accelerator: not parked, the next start is cold (leave what opens it "
                         "out of standby.preload)")  # fmt: skip
    control.sendall(json.dumps({"parked": {"pid": os.getpid(), "imports_s": seconds}}).encode()
                    + b"\n")  # fmt: skip
    reader = control.makefile("rb")
    line = reader.readline()
    if not line:
        return 0  # discarded before a go: nothing of the job ran
    go = json.loads(line)["go"]
    reader.close()
    control.close()
    run_job(go)
    return 0


if __name__ == "__main__":
    sys.exit(main())
