"""Local paths and gs:// URIs behind one small fsspec facade.

gcsfs honours STORAGE_EMULATOR_HOST, so the local pod's emulator needs no special casing here.
"""

from __future__ import annotations

import os

import fsspec

from trainer.config import BadInput


def is_remote(uri: str) -> bool:
    return "://" in uri


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def parent(uri: str) -> str:
    return (
        uri.rstrip("/").rsplit("/", 1)[0]
        if is_remote(uri)
        else os.path.dirname(os.path.abspath(uri))
    )


def normalize(uri: str) -> str:
    return uri.rstrip("/") if is_remote(uri) else os.path.abspath(uri)


def fs(uri: str):
    return fsspec.core.url_to_fs(uri)[0]


def read_bytes(uri: str) -> bytes:
    with fsspec.open(uri, "rb") as f:
        return f.read()


def write_bytes(uri: str, data: bytes) -> None:
    if not is_remote(uri):
        os.makedirs(os.path.dirname(uri) or ".", exist_ok=True)
        tmp = f"{uri}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, uri)
        return
    with fsspec.open(uri, "wb") as f:
        f.write(data)


def exists(uri: str) -> bool:
    return fs(uri).exists(uri)


def check_writable(uri: str, process_id: int) -> None:
    """Fails early, as bad input, when the workdir cannot be written (missing bucket, no access)."""
    probe = join(uri, f".probe-{process_id}")
    try:
        if not is_remote(uri):
            os.makedirs(uri, exist_ok=True)
        write_bytes(probe, b"ok")
        fs(uri).rm(probe)
    except Exception as e:  # noqa: BLE001 - any failure means the same thing to the user
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadInput(f"workdir {uri} is not writable: {reason[:200]}") from None
