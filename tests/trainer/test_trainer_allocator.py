"""The allocator re-exec decision (trainer.allocator: tcmalloc, else glibc on huge pages), and the
real re-exec: same pid, the allocator on the `started` line, bad input still one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import allocator

FAKE_LIB = "libtcmalloc_minimal.so.4"


def test_preload_env_table(tmp_path):
    lib = tmp_path / FAKE_LIB
    lib.write_bytes(b"")
    found, missing = (str(lib),), (str(tmp_path / "absent.so"),)
    huge = {"GLIBC_TUNABLES": allocator.HUGE_PAGES}
    cases = [  # (environment, candidates, libc, expected changes or None for "no re-exec")
        ({}, found, "glibc", {"LD_PRELOAD": str(lib)}),
        ({}, missing, "glibc", huge),  # no tcmalloc: glibc on huge pages
        ({}, missing, "musl", None),  # another C library: left as it is
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, missing, "glibc", None),  # the user's
        (huge, missing, "glibc", None),  # already tuned: no loop
        ({"TPUPOD_ALLOCATOR": "system"}, found, "glibc", None),
        ({"TPUPOD_ALLOCATOR": "system"}, missing, "glibc", None),
        ({"LD_PRELOAD": "/x/libtcmalloc.so.4"}, found, "glibc", None),  # under tcmalloc: no loop
        ({"LD_PRELOAD": "/x/libother.so"}, found, "glibc", {"LD_PRELOAD": f"{lib} /x/libother.so"}),
        ({"TPUPOD_ALLOCATOR": "jemalloc"}, found, "glibc", None),  # unknown value: warn, system
        ({"TPUPOD_TCMALLOC": str(lib)}, missing, "glibc", {"LD_PRELOAD": str(lib)}),  # it wins
        ({"TPUPOD_TCMALLOC": str(tmp_path / "no.so")}, found, "glibc", None),  # not guessed past
    ]
    for environ, candidates, libc, expected in cases:
        env = allocator.preload_env(environ, candidates, libc)
        got = None if env is None else {k: v for k, v in env.items() if environ.get(k) != v}
        assert got == expected, (environ, candidates, libc)


def _loaded_libc() -> str:
    """The C library this process runs with: a harmless library to preload again."""
    maps = Path("/proc/self/maps").read_text().split()
    return next(x for x in maps if "/libc.so" in x or "/libc-" in x)


@pytest.mark.parametrize("choice", ["auto", "system"])
def test_reexec_keeps_pid_exit_code_and_one_line_error(tmp_path, choice):
    """`python -m trainer` re-execs itself under the library TPUPOD_TCMALLOC names (here libc,
    by a tcmalloc-looking name, so the path runs on machines without tcmalloc): the same pid
    reports the allocator on its `started` line, and bad input still exits 2 with one line."""
    lib = tmp_path / "libtcmalloc_stand_in.so"
    lib.symlink_to(_loaded_libc())
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(TPUPOD_TCMALLOC=str(lib), TPUPOD_ALLOCATOR=choice)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "--config", "no-such-preset", "--workdir", str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert len(err.strip().splitlines()) == 1 and "no-such-preset" in err
    started = json.loads(out.splitlines()[0])
    assert started["event"] == "started" and started["pid"] == proc.pid
    assert started["allocator"] == ("tcmalloc" if choice == "auto" else "system")


def test_by_default_the_trainer_reexecs_under_tcmalloc_or_on_huge_pages(tmp_path):
    """The default choice, for real: tcmalloc where this machine has it, else (glibc) the huge
    pages tunable, seen by the re-exec'd trainer itself, under the same pid."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}
    env.pop("TPUPOD_TCMALLOC", None)
    env["TPUPOD_ALLOCATOR"] = "auto"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "--config", "no-such-preset", "--workdir", str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    started = json.loads(out.splitlines()[0])
    has_tcmalloc = any(Path(c).is_file() for c in allocator.CANDIDATES)
    assert started["pid"] == proc.pid
    assert started["allocator"] == ("tcmalloc" if has_tcmalloc else "glibc-hugepages")
