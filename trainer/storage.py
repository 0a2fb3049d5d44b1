"""Local paths and gs:// URIs behind one small fsspec facade.

gcsfs honours STORAGE_EMULATOR_HOST, so the local pod's emulator needs no special casing here.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import fsspec
import fsspec.asyn
import fsspec.exceptions

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
    """Asks the store now: gcsfs answers from a cached listing of the parent otherwise (an object
    another process wrote since would stay missing)."""
    f = fs(uri)
    f.invalidate_cache(parent(uri))
    return f.exists(uri)


# How long the start-up probe waits for a bucket: gcsfs alone retries an unreachable endpoint for
# about 84 s, printing a traceback per try; a trainer that cannot reach its bucket says so sooner.
PROBE_TIMEOUT_S = 20.0


class Unreachable(Exception):
    """The workdir's storage did not answer in time: a failure to retry, not bad input."""


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines()[0] if str(e) else type(e).__name__)[:200]


class _LastRetry(logging.Handler):
    """Keeps gcsfs's retry messages (the cause) off stderr, remembering the last one."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.cause = ""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "exception:" in message:
            self.cause = message.split("exception:", 1)[1].strip().splitlines()[0][:200]


async def _probe_async(f, probe: str) -> None:
    await f._pipe_file(probe, b"ok")
    await f._rm(probe)


def _bounded(fn, timeout: float):
    """fn() in a thread, its result or its exception; TimeoutError past `timeout` (the thread,
    a daemon, is left to finish: only for calls whose own retries are bounded)."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _probe(uri: str, process_id: int, timeout: float) -> str | None:
    """Writes and removes one object; returns the error's first line, or raises TimeoutError.
    On an async filesystem (gcsfs) the attempt is cancelled at the deadline: a thread left
    retrying would go on reading STORAGE_EMULATOR_HOST at every try, long after its caller.
    Making the filesystem (credentials: google-auth may ask the metadata server, with bounded
    retries) counts against the same deadline."""
    deadline = time.monotonic() + timeout
    probe = join(uri, f".probe-{process_id}")
    try:
        f = _bounded(lambda: fs(uri), timeout)
        left = max(0.1, deadline - time.monotonic())
        if getattr(f, "async_impl", False):
            fsspec.asyn.sync(f.loop, _probe_async, f, probe, timeout=left)
            return None
        return _bounded(lambda: _probe_sync(uri, probe), left)
    except (TimeoutError, fsspec.exceptions.FSTimeoutError):
        raise TimeoutError from None
    except Exception as e:  # noqa: BLE001 - any failure means the same thing to the user
        return _first_line(e)


def _probe_sync(uri: str, probe: str) -> None:
    if not is_remote(uri):
        os.makedirs(uri, exist_ok=True)
    write_bytes(probe, b"ok")
    fs(uri).rm(probe)


def check_writable(uri: str, process_id: int, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Fails early when the workdir cannot be written: BadInput for a missing bucket or no
    access, Unreachable when its storage does not answer within `timeout` seconds."""
    log = logging.getLogger("gcsfs")
    saved = log.level, log.propagate
    retries = _LastRetry()
    log.addHandler(retries)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    try:
        error = _probe(uri, process_id, timeout)
    except TimeoutError:
        endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
        bucket = uri.split("://", 1)[1].split("/", 1)[0]
        cause = retries.cause or "no answer"
        raise Unreachable(f"workdir {uri}: bucket {bucket} unreachable at {endpoint} for "
                          f"{timeout:.0f} s ({cause}); check the network path to storage") from None  # fmt: skip
    finally:
        log.removeHandler(retries)
        log.setLevel(saved[0])
        log.propagate = saved[1]
    if error:
        raise BadInput(f"workdir {uri} is not writable: {error}")
