"""The publishing side of trainer/bytecode.py: once a job in tpupod's worker environment
(`python: none`, the built-in trainer's too) reports its first progress, its launcher
(bootstrap/jobrun.py) starts this module to archive the bytecode of the modules the job imported
from that venv, when the venv's restore found no archive.

Which modules: the ones with a pyc in the venv's `__pycache__` directories: the venv is new (its
restore found nothing to restore), so Python wrote each of those when the job first imported the
module. The archive holds checked-hash pycs (PEP 552). Where Python already wrote a pyc that is
certainly current, only its header changes; anything else is compiled. It runs at the lowest CPU
priority, from `/` (jobctl counts a process whose cwd is a bundle as the job), and stops when its
launcher is gone: a first run shorter than the publish publishes nothing, and the next start
tries again.

    python -m trainer.bytecode_publish CACHE_URI --venv VENV
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import marshal
import os
import sys
import tarfile
from pathlib import Path

from trainer.bytecode import archive_uri, mark_published, read_marker, site_packages

_CHECKED_HASH = (0b11).to_bytes(4, "little")  # PEP 552 flags: hash-based, check the source


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


def pycache_sources(venv: Path) -> list[str]:
    """Source files in the venv's site-packages that have a pyc of this interpreter: the
    modules imported since the venv was made."""
    tag = f".{sys.implementation.cache_tag}.pyc"
    found = []
    for pyc in site_packages(venv).rglob(f"__pycache__/*{tag}"):
        source = pyc.parent.parent / (pyc.name[: -len(tag)] + ".py")
        if source.is_file():
            found.append(str(source))
    return found


def _publish_main(cache_uri: str, venv: Path) -> int:
    launcher = os.getppid()
    os.nice(19)
    # Out of the bundle: jobctl counts a process whose cwd is a bundle as the job.
    os.chdir("/")
    marker = read_marker(venv)
    if marker.get("found") is not False or marker.get("published"):
        return 0  # restored from an archive, published already, or not a venv the bootstrap made
    from trainer import storage  # fsspec/gcsfs: the trainer's own storage path

    def launcher_alive() -> bool:  # the job's launcher gone (the job ended or was killed): stop
        return os.getppid() == launcher

    uri = archive_uri(cache_uri, venv)
    if not marker.get("unreadable") and storage.exists(uri):
        mark_published(venv)
        return 0
    data, count = build_archive(venv, pycache_sources(venv), launcher_alive)
    if count and launcher_alive():
        storage.write_bytes(uri, data)
        mark_published(venv)
        print(f"bytecode: published {count} modules ({len(data) / 1e6:.1f} MB) to {uri}",
              file=sys.stderr, flush=True)  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.bytecode_publish", description=__doc__)
    p.add_argument("cache_uri", help="the compile cache (local or gs://)")
    p.add_argument("--venv", required=True, type=Path)
    args = p.parse_args(argv)
    return _publish_main(args.cache_uri, args.venv)


if __name__ == "__main__":
    sys.exit(main())
