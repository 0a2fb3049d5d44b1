"""Runs the trainer under tcmalloc where the machine has it (CPU speed).

XLA:CPU allocates a step's temporaries afresh on every execution. glibc returns large freed blocks
to the kernel, so each step pays again for page faults and for zeroing fresh pages (`uv run python
-m bench trainer` compares both allocators on `small`). tcmalloc keeps freed memory for reuse
(MaxText preloads it on TPU hosts for the same reason). The library must be loaded before the
process starts, so `python -m trainer` re-execs itself once with LD_PRELOAD set: the pid stays the
same, so supervisors that track it are unaffected.

    TPUPOD_ALLOCATOR=auto     (default) tcmalloc when one of CANDIDATES exists, else the system's
    TPUPOD_ALLOCATOR=system   never re-exec
    TPUPOD_TCMALLOC=PATH      the library, where a distribution keeps it elsewhere
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "TPUPOD_ALLOCATOR"
LIB_ENV = "TPUPOD_TCMALLOC"
# Debian/Ubuntu packages libtcmalloc-minimal4 and libgoogle-perftools4, for x86-64 and arm64.
CANDIDATES = tuple(
    f"/usr/lib/{arch}-linux-gnu/{lib}"
    for arch in ("x86_64", "aarch64")
    for lib in ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
)


def _preloaded(environ) -> bool:
    """Already under tcmalloc: the re-exec'd process, or a user's own LD_PRELOAD."""
    return "tcmalloc" in environ.get("LD_PRELOAD", "")


def preload_env(environ: dict, candidates=CANDIDATES) -> dict | None:
    """The environment to re-exec with, or None to keep this process as it is."""
    choice = environ.get(ENV, "auto")
    if choice == "system" or _preloaded(environ):
        return None
    if choice != "auto":
        print(f"{ENV}={choice!r} is not one of auto, system; using the system allocator",
              file=sys.stderr)  # fmt: skip
        return None
    if environ.get(LIB_ENV):
        candidates = (environ[LIB_ENV],)
    lib = next((c for c in candidates if Path(c).is_file()), None)
    if lib is None:
        return None
    preload = " ".join(p for p in (lib, environ.get("LD_PRELOAD", "")) if p)
    return {**environ, "LD_PRELOAD": preload}


def name() -> str:
    """The allocator this process runs with, for the `started` log line."""
    return "tcmalloc" if _preloaded(os.environ) else "system"


def reexec_with_tcmalloc(argv: list[str]) -> None:
    """Replaces this process with `python -m trainer ARGV` under tcmalloc, when that applies."""
    env = preload_env(dict(os.environ))
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "trainer", *argv], env)
