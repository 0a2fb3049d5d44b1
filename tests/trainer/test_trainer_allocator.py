"""The tcmalloc re-exec decision (trainer.allocator) and that the re-exec keeps the trainer's
exit code and pid-visible behaviour: a bad-input run still ends with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys

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
    ]
    for environ, candidates, expected in cases:
        env = allocator.preload_env(environ, candidates)
        got = None if env is None else env["LD_PRELOAD"]
        assert got == expected, (environ, candidates)


def test_reexec_keeps_exit_code_and_one_line_error(tmp_path):
    """Through `python -m trainer` (which re-execs under tcmalloc where installed) bad input
    still gives exit 2 and one line on stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", "no-such-preset", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "no-such-preset" in proc.stderr
