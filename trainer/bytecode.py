"""Python bytecode for a new venv, kept in the bucket beside the compile cache: its name, and
its restore into a new venv (the bootstrap's `bytecode` phase).

Why: a re-created TPU VM syncs a fresh venv that holds no bytecode, so its trainer's first imports
(jax, flax, optax, orbax, grain and theirs: over a thousand modules) compile every one from
source, seconds on the recovery path that a warm restart does not pay. The first job on an
environment (tpupod's worker environment: the built-in trainer or any `python: none` job)
publishes the bytecode of the modules it imported (trainer/bytecode_publish.py, started by the
job's launcher); the bootstrap of a new venv restores it before the job starts (here).

The files are checked-hash pycs (PEP 552): Python uses one only while the hash of its source
matches, so an archive from another environment costs a compile. Like a compile-cache entry, the
archive is code: it lives in the job's bucket, trusted like its checkpoints. Restoring writes only
new `__pycache__/*.pyc` files inside the venv (uv hardlinks the venv's files to its cache: nothing
existing is written over) and never fails a boot.

Stdlib only: the bootstrap runs this file with `python -I -S`, before anything is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

FORMAT = "1"  # bump when the archive layout changes
MARKER = ".tpupod-bytecode"  # in the venv: what its restore found (the publisher reads it)


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def archive_key(venv: Path) -> str:
    """What the bytecode depends on: the interpreter and the installed distributions."""
    dists = sorted(p.name for p in site_packages(venv).glob("*.dist-info"))
    parts = [FORMAT, sys.version, sys.implementation.cache_tag, os.uname().machine, *dists]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def archive_uri(cache_uri: str, venv: Path) -> str:
    return f"{cache_uri.rstrip('/')}/bytecode/py-{archive_key(venv)[:40]}.tar.gz"


def read_marker(venv: Path) -> dict:
    try:
        marker = json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def mark_published(venv: Path) -> None:
    """The archive for this venv is in the bucket now: later trainer starts in it (in-place
    restarts) skip the publisher, which would only import its storage layer to find that out."""
    marker = read_marker(venv)
    if not marker:
        return
    try:  # a saving only: a venv it cannot write to keeps publishing (and finding it there)
        fd, tmp = tempfile.mkstemp(dir=venv, prefix=f"{MARKER}.")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({**marker, "published": True}) + "\n")
        os.replace(tmp, venv / MARKER)
    except OSError:
        pass


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
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as md() does
    with no_proxy.open(token_request, timeout=timeout) as resp:
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


def fetch(uri: str, timeout: float = 10.0) -> bytes | None:
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
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")  # O_EXCL
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                os.chmod(tmp, 0o644)
                os.replace(tmp, dest)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
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
    # An unreadable archive counts as none: this venv's job publishes a new one over it.
    marker = {"uri": uri, "found": data is not None and not error, "unreadable": bool(error),
              "restored": restored}  # fmt: skip
    (venv / MARKER).write_text(json.dumps(marker) + "\n")
    if data is None:
        return f"bytecode: none at {uri} yet (the first job publishes it)"
    if error:
        return (f"bytecode: {uri} is unreadable ({error}): the first imports compile from "
                "source, and this venv's job publishes a new archive")  # fmt: skip
    return f"bytecode: restored {restored} modules from {uri} ({len(data) / 1e6:.1f} MB)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bytecode.py", description="Python bytecode for a new venv")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("restore", help="fetch the archive into a new venv (the bootstrap)")
    r.add_argument("cache_uri", help="the compile cache (TPUPOD_COMPILE_CACHE)")
    r.add_argument("--venv", required=True, type=Path)
    args = p.parse_args(argv)
    print(restore(args.venv, args.cache_uri), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
