"""A checkpoint step's manifest as written by the job (trainer/manifest.py) and checked by
whoever restores or inspects it (the trainer, `tpupod checkpoints`): its file name, its format,
Orbax's commit files it leaves out, how a step that failed its checks is set aside, and the check
itself (pure: the caller lists the step's files, locally or on GCS)."""

from __future__ import annotations

import re
import time

NAME = "tpupod-manifest.json"
# A committed step that failed its checks is renamed, never deleted: `<step>.unreadable-<UTC>`.
ASIDE_SUFFIX = ".unreadable-"
ASIDE = re.compile(r"^(\d+)" + re.escape(ASIDE_SUFFIX) + r"(.+)$")


def aside_name(step_dir: str) -> str:
    """Where a step directory (a path or URI) goes when it is set aside, stamped now (UTC)."""
    return f"{step_dir}{ASIDE_SUFFIX}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"


FORMAT = "tpupod-manifest-v1"
# Orbax writes these at its commit, after the manifest (manifests from before listed them too).
COMMIT_SUCCESS = "commit_success.txt"  # on GCS, a step without it is not committed
COMMIT_FILES = frozenset({COMMIT_SUCCESS, "_CHECKPOINT_METADATA"})


def differences(manifest: dict, files: dict[str, list]) -> str | None:
    """None when `files` (relative path -> [size, CRC32C]) are exactly the manifest's (Orbax's
    commit files aside), else the first difference, as `file: what`."""
    if manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        return f"{NAME}: not a {FORMAT} manifest"
    listed = {rel: v for rel, v in manifest["files"].items() if rel not in COMMIT_FILES}
    files = {rel: v for rel, v in files.items() if rel not in COMMIT_FILES}
    if not listed:
        return f"{NAME}: lists no files"
    for rel in sorted(set(listed) | set(files)):
        if rel not in files:
            return f"{rel}: missing (the manifest lists it)"
        if rel not in listed:
            return f"{rel}: not in the manifest (added after the commit)"
        (size, crc), (want_size, want_crc) = files[rel], listed[rel]
        if size != want_size:
            return f"{rel}: {size} bytes, the manifest says {want_size}"
        if crc != want_crc:
            return f"{rel}: CRC32C {crc}, the manifest says {want_crc} (its bytes changed)"
    return None
