"""Python bytecode for a new venv, kept in the bucket beside the compile cache.

Why: a re-created TPU VM syncs a fresh venv that holds no bytecode, so its trainer's first imports
(jax, flax, optax, orbax, grain and theirs: over a thousand modules) compile every one from
source, seconds on the recovery path that a warm restart does not pay. The first trainer on an
environment publishes the bytecode of the modules it imported; the bootstrap of a new venv
restores it before the trainer starts.

The files are checked-hash pycs (PEP 552): Python uses one only while the hash of its source
matches, so an archive from another environment costs a compile, never stale code. Like a
compile-cache entry, the archive is code: it lives in the job's bucket, trusted like its
checkpoints. Restoring writes only new `__pycache__/*.pyc` files inside the venv (uv hardlinks the
venv's files to its cache: nothing existing is written over) and never fails a boot.

Stdlib only at import: the bootstrap runs this file with `python -I -S`, before anything else is
imported (`restore`); the trainer imports it (`publish_soon`, `stop_publishing`).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import marshal
import os
import subprocess
import sys
import tarfile
import threading
import zlib
from pathlib import Path, PurePosixPath

FORMAT = "1"  # bump when the archive layout changes
MARKER = ".tpupod-bytecode"  # in the venv: what its restore found (the trainer reads it)
_CHECKED_HASH = (0b11).to_bytes(4, "little")  # PEP 552 flags: hash-based, check the source
_publisher: subprocess.Popen | None = None


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def archive_key(venv: Path) -> str:
    """What the bytecode depends on: the interpreter and the installed distributions."""
    dists = sorted(p.name for p in site_packages(venv).glob("*.dist-info"))
    parts = [FORMAT, sys.version, sys.implementation.cache_tag, os.uname().machine, *dists]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def archive_uri(cache_uri: str, venv: Path) -> str:
    return f"{cache_uri.rstrip('/')}/bytecode/py-{archive_key(venv)[:40]}.tar.gz"


# -- building (the trainer's publisher) ------------------------------------------------------


def hash_pyc(source_path: str) -> bytes:
    """The checked-hash pyc of a source: the bytecode Python already wrote for it when that is
    current (only the header changes), compiled afresh otherwise."""
    source = Path(source_path).read_bytes()
    header = importlib.util.MAGIC_NUMBER + _CHECKED_HASH + importlib.util.source_hash(source)
    try:
        cached = Path(importlib.util.cache_from_source(source_path)).read_bytes()
        st = os.stat(source_path)
    except (OSError, ValueError):
        cached = b""
    if len(cached) > 16 and cached[:4] == importlib.util.MAGIC_NUMBER:
        flags = int.from_bytes(cached[4:8], "little")
        if flags == 0:  # timestamp pyc: current while mtime and size match
            current = cached[8:16] == (
                (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
            )
        else:
            current = cached[8:16] == header[8:16]
        if current:
            return header + cached[16:]
    code = compile(source, source_path, "exec", dont_inherit=True)
    return header + marshal.dumps(code)


def build_archive(venv: Path, sources: list[str]) -> tuple[bytes, int]:
    """A tar.gz of checked-hash pycs at their `__pycache__` paths relative to the venv."""
    buf = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for source in sorted(set(sources)):
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


def read_marker(venv: Path) -> dict:
    try:
        return json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def publish_soon(cache_uri: str | None) -> None:
    """Publish this process's imports when its venv's restore found no archive (a venv the
    bootstrap did not make has no marker: nothing to serve), in a child at the lowest CPU
    priority, so the training loop does not wait on it."""
    global _publisher
    venv = Path(sys.prefix)
    if cache_uri is None or _publisher is not None or read_marker(venv).get("found") is not False:
        return
    sources = imported_sources(venv)
    if not sources:
        return
    _publisher = subprocess.Popen(
        [sys.executable, "-m", "trainer.bytecode", "publish", cache_uri, "--venv", str(venv)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    # The list outgrows a pipe's buffer: fed from a thread, so the loop never waits on the child.
    threading.Thread(target=_feed, args=(_publisher, "\n".join(sources)), daemon=True).start()


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


def _publish_main(cache_uri: str, venv: Path) -> int:
    sources = [line for line in sys.stdin.read().split("\n") if line]
    os.nice(19)
    from trainer import storage  # fsspec/gcsfs: the trainer's own storage path

    uri = archive_uri(cache_uri, venv)
    if storage.exists(uri):
        return 0
    data, count = build_archive(venv, sources)
    if count:
        storage.write_bytes(uri, data)
        print(f"bytecode: published {count} modules ({len(data) / 1e6:.1f} MB) to {uri}",
              file=sys.stderr, flush=True)  # fmt: skip
    return 0


# -- restoring (the bootstrap, before the trainer starts) ------------------------------------


def _gcs_get(uri: str, timeout: float) -> bytes | None:
    import urllib.error
    import urllib.parse
    import urllib.request

    bucket, _, name = uri[len("gs://") :].partition("/")
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    token_request = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token",
        headers={"Metadata-Flavor": "Google"},
    )
    with urllib.request.urlopen(token_request, timeout=timeout) as resp:
        token = json.loads(resp.read())["access_token"]
    endpoint = os.environ.get("STORAGE_EMULATOR_HOST", "https://storage.googleapis.com")
    request = urllib.request.Request(
        f"{endpoint.rstrip('/')}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
        "?alt=media",
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def fetch(uri: str, timeout: float = 30.0) -> bytes | None:
    """The archive's bytes, or None when there is none yet."""
    if uri.startswith("gs://"):
        return _gcs_get(uri, timeout)
    try:
        return Path(uri).read_bytes()
    except FileNotFoundError:
        return None


def _member_path(venv: Path, name: str) -> Path | None:
    """Where a member may go: a `__pycache__/*.pyc` under the venv's lib/, beside a package
    directory that exists; None for anything else."""
    parts = PurePosixPath(name)
    if parts.is_absolute() or ".." in parts.parts or parts.parts[:1] != ("lib",):
        return None
    if parts.suffix != ".pyc" or parts.parent.name != "__pycache__":
        return None
    dest = venv.joinpath(*parts.parts)
    return dest if dest.parent.parent.is_dir() else None


def extract(venv: Path, data: bytes) -> int:
    """Write the archive's pycs that the venv lacks; each file whole or not at all."""
    written = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar:
            dest = _member_path(venv, member.name) if member.isfile() else None
            if dest is None or dest.exists():
                continue
            body = tar.extractfile(member).read()
            dest.parent.mkdir(exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            tmp.write_bytes(body)
            os.replace(tmp, dest)
            written += 1
    return written


def restore(venv: Path, cache_uri: str) -> str:
    """Once per venv: the archive's bytecode into it. Returns the line to log."""
    if (venv / MARKER).exists():
        return f"bytecode: already handled for this venv ({venv / MARKER})"
    uri = archive_uri(cache_uri, venv)
    data = fetch(uri)
    restored, error = 0, None
    if data is not None:
        try:
            restored = extract(venv, data)
        except (tarfile.TarError, EOFError, zlib.error) as e:
            error = f"{type(e).__name__}: {e}"
    marker = {"key": archive_key(venv), "uri": uri, "found": data is not None}
    (venv / MARKER).write_text(json.dumps({**marker, "restored": restored}) + "\n")
    if data is None:
        return f"bytecode: none at {uri} yet (the first trainer publishes it)"
    if error:
        return (f"bytecode: {uri} is unreadable ({error}); the first imports compile from source; "
                "delete it and the next trainer publishes a new one")  # fmt: skip
    return f"bytecode: restored {restored} modules from {uri} ({len(data) / 1e6:.1f} MB)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bytecode.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("restore", help="fetch the archive into a new venv (the bootstrap)")
    r.add_argument("cache_uri", help="the compile cache (TPUPOD_COMPILE_CACHE)")
    r.add_argument("--venv", required=True, type=Path)
    w = sub.add_parser("publish", help="archive the sources named on stdin (the trainer)")
    w.add_argument("cache_uri")
    w.add_argument("--venv", required=True, type=Path)
    args = p.parse_args(argv)
    if args.command == "publish":
        return _publish_main(args.cache_uri, args.venv)
    print(restore(args.venv, args.cache_uri), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
