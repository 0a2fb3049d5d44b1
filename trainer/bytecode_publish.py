"""The trainer's side of trainer/bytecode.py: after its first step, process 0 archives the bytecode
of the modules it imported from its venv, when that venv's restore found no archive.

The archive holds checked-hash pycs (PEP 552). Where Python already wrote a pyc that is certainly
current, only its header changes; anything else is compiled. The work runs in a child at the
lowest CPU priority, outside the bundle directory (trainerctl counts a process whose cwd is a
bundle as the trainer), which stops when the trainer is gone, and which the trainer stops at its
exit: a first run shorter than the publish publishes nothing, and the next start tries again.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import marshal
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

from trainer.bytecode import archive_uri, mark_published, read_marker, site_packages

_CHECKED_HASH = (0b11).to_bytes(4, "little")  # PEP 552 flags: hash-based, check the source
_publisher: subprocess.Popen | None = None


def _reusable(cached: bytes, pyc_mtime: float, source_stat: os.stat_result, hash_: bytes) -> bool:
    """Whether the bytecode Python wrote is certainly that of the source as it is now.

    A hash-based pyc: its hash matches. A timestamp pyc (PEP 552 flags bit 0 clear) records the
    source's mtime in whole seconds and its size; both must match, and the pyc must have been
    written in a later second than that mtime: a source rewritten within the second it was
    compiled, at the same size, would pass Python's own check (the "racy git" case) but not this.
    """
    if len(cached) <= 16 or cached[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(cached[4:8], "little")
    if flags & ~0b11:
        return False
    if flags & 0b1:
        return cached[8:16] == hash_
    recorded = (int(source_stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
    size = (source_stat.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    return cached[8:16] == recorded + size and int(pyc_mtime) > int(source_stat.st_mtime)


def hash_pyc(source_path: str) -> bytes:
    """The checked-hash pyc of a source: the bytecode Python already wrote for it when that is
    certainly current (only the header changes), compiled afresh otherwise."""
    source = Path(source_path).read_bytes()
    hash_ = importlib.util.source_hash(source)
    header = importlib.util.MAGIC_NUMBER + _CHECKED_HASH + hash_
    try:
        pyc = importlib.util.cache_from_source(source_path, optimization="")
        cached, pyc_mtime = Path(pyc).read_bytes(), os.stat(pyc).st_mtime
        if _reusable(cached, pyc_mtime, os.stat(source_path), hash_):
            return header + cached[16:]
    except (OSError, ValueError):
        pass
    code = compile(source, source_path, "exec", dont_inherit=True, optimize=0)
    return header + marshal.dumps(code)


def build_archive(venv: Path, sources: list[str], go_on=lambda: True) -> tuple[bytes, int]:
    """A tar.gz of checked-hash pycs at their `__pycache__` paths relative to the venv; stops
    early (count 0) once `go_on()` is false."""
    buf = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for source in sorted(set(sources)):
            if not go_on():
                return b"", 0
            path = Path(source)
            name = path.parent / "__pycache__" / f"{path.stem}.{sys.implementation.cache_tag}.pyc"
            try:
                member = name.relative_to(venv).as_posix()
                data = hash_pyc(source)
            except (OSError, SyntaxError, ValueError):  # outside the venv, gone, or not Python
                continue
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
            count += 1
    return buf.getvalue(), count


def imported_sources(venv: Path) -> list[str]:
    """Source files of the modules this process imported from the venv's site-packages."""
    prefix = str(site_packages(venv)) + os.sep
    found = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py") and path.startswith(prefix):
            found.append(path)
    return found


def publish_soon(cache_uri: str | None) -> None:
    """Publish this process's imports when its venv's restore found no archive (a venv the
    bootstrap did not make has no marker: nothing to serve), in a child at the lowest CPU
    priority, so the training loop does not wait on it."""
    global _publisher
    venv = Path(sys.prefix)
    if cache_uri is None or _publisher is not None:
        return
    marker = read_marker(venv)
    if marker.get("found") is not False or marker.get("published"):
        return
    sources = imported_sources(venv)
    if not sources:
        return
    if "://" not in cache_uri:
        cache_uri = os.path.abspath(cache_uri)  # the child works from /
    command = [sys.executable, "-m", "trainer.bytecode_publish", cache_uri, "--venv", str(venv)]
    if marker.get("unreadable"):
        command.append("--replace")
    try:
        _publisher = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
        )
        # The list outgrows a pipe's buffer: fed from a thread, so the loop never waits on it.
        threading.Thread(target=_feed, args=(_publisher, "\n".join(sources)), daemon=True).start()
    except Exception as e:  # noqa: BLE001 - a cache: training goes on whatever happens here
        print(f"warning: bytecode not published: {e}", file=sys.stderr, flush=True)


def _feed(proc: subprocess.Popen, text: str) -> None:
    try:
        proc.stdin.write(text)
        proc.stdin.close()
    except OSError:  # the child was stopped
        pass


def stop_publishing(timeout: float = 0.0) -> None:
    """At exit: give a publisher still running `timeout` s, then stop it (the next start
    publishes): nothing of ours outlives the trainer."""
    if _publisher is None or _publisher.poll() is not None:
        return
    try:
        _publisher.wait(timeout)
    except subprocess.TimeoutExpired:
        _publisher.kill()
        _publisher.wait()


def _publish_main(cache_uri: str, venv: Path, replace: bool) -> int:
    sources = [line for line in sys.stdin.read().split("\n") if line]
    trainer = os.getppid()
    os.nice(19)
    from trainer import storage  # fsspec/gcsfs: the trainer's own storage path

    # Out of the bundle: trainerctl counts a process whose cwd is a bundle as the trainer.
    os.chdir("/")

    def trainer_alive() -> bool:  # a trainer killed outright leaves us orphaned: stop
        return os.getppid() == trainer

    uri = archive_uri(cache_uri, venv)
    if not replace and storage.exists(uri):
        mark_published(venv)
        return 0
    data, count = build_archive(venv, sources, trainer_alive)
    if count and trainer_alive():
        storage.write_bytes(uri, data)
        mark_published(venv)
        print(f"bytecode: published {count} modules ({len(data) / 1e6:.1f} MB) to {uri}",
              file=sys.stderr, flush=True)  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.bytecode_publish", description=__doc__)
    p.add_argument("cache_uri", help="the compile cache; source paths come on stdin")
    p.add_argument("--venv", required=True, type=Path)
    p.add_argument("--replace", action="store_true", help="write over an unreadable archive")
    args = p.parse_args(argv)
    return _publish_main(args.cache_uri, args.venv, args.replace)


if __name__ == "__main__":
    sys.exit(main())
