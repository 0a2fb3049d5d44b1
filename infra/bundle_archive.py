"""The code bundle: one deterministic archive of what a worker needs.

Used by both the Pulumi program (uploaded as a bucket object) and the local pod, so the bytes a
worker fetches are the same everywhere. Same inputs -> same bytes, whatever the file times.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The watcher VM runs `python -m ops` from the same bundle, which imports infra and localpod.
BUNDLE_PATHS = (
    "trainer", "bootstrap", "ops", "infra", "localpod",
    "pyproject.toml", "uv.lock", ".python-version", "README.md",
)  # fmt: skip
_SKIP_PARTS = {"__pycache__", ".pytest_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str

    @property
    def object_name(self) -> str:
        return f"bundles/{self.sha256}.tar.gz"


def _files(root: Path) -> list[Path]:
    found: list[Path] = []
    for name in BUNDLE_PATHS:
        path = root / name
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(
                p
                for p in path.rglob("*")
                if p.is_file()
                and not _SKIP_PARTS.intersection(p.relative_to(root).parts)
                and p.suffix not in _SKIP_SUFFIXES
            )
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def build_bundle(root: Path = PROJECT_ROOT) -> Bundle:
    """A gzip'd tar with fixed owners, modes and times, files in sorted order."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _files(root):
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            content = path.read_bytes()
            info.size = len(content)
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(content))
    data = gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest())
