"""The tcmalloc re-exec decision (trainer.allocator), and the real re-exec: same pid, the
allocator on the `started` line, bad input still one line and exit 2."""

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
    cases = [  # (environment, candidates, expected LD_PRELOAD or None for "no re-exec")
        ({}, found, str(lib)),
        ({}, missing, None),
        ({"TPUPOD_ALLOCATOR": "system"}, found, None),
        ({"LD_PRELOAD": "/x/libtcmalloc.so.4"}, found, None),  # already under tcmalloc: no loop
        ({"LD_PRELOAD": "/x/libother.so"}, found, f"{lib} /x/libother.so"),
        ({"TPUPOD_ALLOCATOR": "jemalloc"}, found, None),  # unknown value: warn, keep system
        ({"TPUPOD_TCMALLOC": str(lib)}, missing, str(lib)),  # an explicit path wins
        ({"TPUPOD_TCMALLOC": str(tmp_path / "nope.so")}, found, None),  # and is never guessed past
    ]
    for environ, candidates, expected in cases:
        env = allocator.preload_env(environ, candidates)
        got = None if env is None else env["LD_PRELOAD"]
        assert got == expected, (environ, candidates)


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
