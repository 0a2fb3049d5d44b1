"""The code bundle: one deterministic archive of what a worker needs, the job's directory included.

Used by both the Pulumi program (uploaded as a bucket object) and the local pod, so the bytes a
worker fetches are the same everywhere. Same inputs -> same bytes, whatever the file times. The
job's files go under `job/` (its `run` runs there); tpupod's own code beside it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from contract.job import Job
from infra.builtin_job import builtin

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The watcher VM runs `python -m ops` from the same bundle, which imports infra; every side
# imports contract (the worker's launcher too). The test bed
# (localpod, bench) stays on the operator's machine: nothing the workers or the watcher run needs it.
BUNDLE_PATHS = (
    "contract", "trainer", "bootstrap", "ops", "infra",
    "pyproject.toml", "uv.lock", ".python-version", "README.md",
)  # fmt: skip
JOB_DIR = "job"  # where the job's directory lands in the bundle
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


def build_bundle(root: Path = PROJECT_ROOT, job: Job | None = None) -> Bundle:
    """A gzip'd tar with fixed owners, modes and times, files in sorted order; `job` (default:
    the built-in trainer's) under `job/`."""
    job = job or builtin()
    entries = [(p.relative_to(root).as_posix(), p.read_bytes(), bool(p.stat().st_mode & 0o111))
               for p in _files(root)]  # fmt: skip
    entries += [(f"{JOB_DIR}/{name}", data, name in job.executables)
                for name, data in sorted(job.files.items())]  # fmt: skip
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content, executable in entries:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o755 if executable else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(content))
    data = gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest())
