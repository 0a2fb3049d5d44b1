"""Runs the trainer under tcmalloc where the machine has it, else glibc on huge pages (CPU speed).

XLA:CPU allocates a step's temporaries afresh on every execution. glibc serves large blocks with
fresh mmaps and returns them to the kernel when freed, so each step pays again for page faults and
for zeroing fresh pages: `small` took ~270 k faults a step and 14 % of its CPU in the kernel
(`uv run python -m bench trainer` compares the chosen allocator with the plain system one). tcmalloc keeps freed memory for reuse (MaxText preloads it
on TPU hosts for the same reason). Without it, glibc >= 2.35's `glibc.malloc.hugetlb=1` tunable
asks for transparent huge pages on malloc's memory: one fault per 2 MiB instead of per 4 KiB (a
no-op where THP is `never`, an unknown tunable that older glibc ignores). Both must be in place
before the process starts, so `python -m trainer` re-execs itself once with LD_PRELOAD or
GLIBC_TUNABLES set: the pid stays the same, so supervisors that track it are unaffected.

    TPUPOD_ALLOCATOR=auto     (default) tcmalloc when one of CANDIDATES exists, else glibc with
                              HUGE_PAGES (unless GLIBC_TUNABLES is already set: the user's wins)
    TPUPOD_ALLOCATOR=system   never re-exec
    TPUPOD_TCMALLOC=PATH      the library, where a distribution keeps it elsewhere (when it is
                              missing, the system allocator as it is)
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
TUNABLES = "GLIBC_TUNABLES"
HUGE_PAGES = "glibc.malloc.hugetlb=1"


def _preloaded(environ) -> bool:
    """Already under tcmalloc: the re-exec'd process, or a user's own LD_PRELOAD."""
    return "tcmalloc" in environ.get("LD_PRELOAD", "")


def _libc() -> str:
    """'glibc' under glibc (its own answer, no scan of the executable as platform.libc_ver does)."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").split(" ")[0]
    except (ValueError, OSError):  # a C library without the GNU name
        return ""


def _tuned(environ) -> bool:
    return HUGE_PAGES in environ.get(TUNABLES, "").split(":")


def preload_env(environ: dict, candidates=CANDIDATES, libc: str | None = None) -> dict | None:
    """The environment to re-exec with, or None to keep this process as it is."""
    choice = environ.get(ENV, "auto")
    if choice == "system" or _preloaded(environ) or _tuned(environ):
        return None
    if choice != "auto":
        print(f"{ENV}={choice!r} is not one of auto, system; using the system allocator",
              file=sys.stderr)  # fmt: skip
        return None
    if environ.get(LIB_ENV):
        candidates = (environ[LIB_ENV],)
    lib = next((c for c in candidates if Path(c).is_file()), None)
    if lib is None:
        named = environ.get(LIB_ENV)  # a library asked for by name is never replaced by another
        libc = _libc() if libc is None else libc
        if named or TUNABLES in environ or libc != "glibc":
            return None
        return {**environ, TUNABLES: HUGE_PAGES}
    preload = " ".join(p for p in (lib, environ.get("LD_PRELOAD", "")) if p)
    return {**environ, "LD_PRELOAD": preload}


def name() -> str:
    """The allocator this process runs with, for the `started` log line."""
    if _preloaded(os.environ):
        return "tcmalloc"
    return "glibc-hugepages" if _tuned(os.environ) else "system"


def reexec_with_allocator(argv: list[str]) -> None:
    """Replaces this process with `python -m trainer ARGV` under the allocator preload_env picks."""
    env = preload_env(dict(os.environ))
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "trainer", *argv], env)
