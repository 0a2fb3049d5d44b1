"""The slice's bucket: gcp-storage-emulator as a subprocess, plus the bundle upload.

Uploads go over the emulator's JSON upload API with plain HTTP, the same wire calls a real
client makes against GCS, so nothing here knows it is talking to an emulator. In a pod the bucket
authorises every call (localpod.gcp.storage_iam): these helpers send the token they are given (the
pod's own calls are the operator's: `pulumi up` uploads the bundle).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

from infra.bundle_archive import Bundle
from localpod.gcp import emulator
from localpod.procs import free_port

PORT_ATTEMPTS = 3  # a port is picked free, then bound by the emulator: another process may win


class PortTaken(RuntimeError):
    """The emulator's port was bound by another process between its pick and the emulator's bind
    (the emulator exits with EADDRINUSE): start it again on a port picked again."""


def emulator_command(port: int, bucket: str) -> list[str]:
    """The emulator in memory (localpod.gcp.emulator says why): it lives as long as the pod."""
    return [sys.executable, "-m", "localpod.gcp.emulator", "start", "--host", "127.0.0.1",
            "--port", str(port), "--default-bucket", bucket]  # fmt: skip


def start_emulator(port: int, bucket: str, data_dir: Path, log: Path, pod_dir: Path | None = None,
                   listeners: dict[str, str] | None = None) -> subprocess.Popen:  # fmt: skip
    """Start the emulator with `data_dir` as its working directory (objects stay in memory);
    with `pod_dir` it enforces the pod's IAM, `listeners` (address -> member) its VMs' URLs."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "STORAGE_BASE": str(data_dir)}
    if pod_dir is not None:
        env[emulator.POD_DIR_ENV] = str(pod_dir)
        env[emulator.LISTENERS_ENV] = json.dumps(listeners or {})
    with log.open("ab") as out:
        return subprocess.Popen(
            emulator_command(port, bucket),
            cwd=data_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(proc: subprocess.Popen, url: str, bucket: str, timeout: float = 60.0,
               token: str | None = None) -> None:  # fmt: skip
    """Until the default bucket answers; the emulator creates it while starting."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(f"{url}/storage/v1/b/{bucket}", headers=auth(token))
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if proc.returncode == errno.EADDRINUSE:
                raise PortTaken(f"gcp-storage-emulator: its port was taken ({url})")
            raise RuntimeError(f"gcp-storage-emulator exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(request, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"gcp-storage-emulator not ready after {timeout:.0f} s")


def ready_on_a_free_port(proc: subprocess.Popen, port: int,
                         start: Callable[[int], subprocess.Popen],
                         wait: Callable[[subprocess.Popen, int], None],
                         pick: Callable[[], int] = lambda: free_port("0.0.0.0")) -> int:  # fmt: skip
    """`wait(proc, port)` until the emulator serves; one whose port another process took first
    (PortTaken: it exited at once) is started again by `start` on a port `pick`ed anew, up to
    PORT_ATTEMPTS in all. Returns the port it serves on; `start` keeps each process it starts
    (its caller stops them)."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            wait(proc, port)
            return port
        except PortTaken:
            if attempt == PORT_ATTEMPTS:
                raise
        proc.wait()
        port = pick()
        proc = start(port)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def running_emulator(bucket: str, log: Path | None = None) -> Iterator[str]:
    """A standalone emulator on a free loopback port, for benchmarks and tests that need GCS but
    no pod: yields its URL once `bucket` answers; its process group is killed on exit."""
    started: list[subprocess.Popen] = []

    def start(port: int) -> subprocess.Popen:
        out = log.open("ab") if log is not None else subprocess.DEVNULL
        try:
            started.append(subprocess.Popen(emulator_command(port, bucket), stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True))  # fmt: skip
        finally:
            if log is not None:
                out.close()
        return started[-1]

    def url(port: int) -> str:
        return f"http://127.0.0.1:{port}"

    try:
        port = free_port("127.0.0.1")
        port = ready_on_a_free_port(start(port), port, start,
                                    lambda proc, p: wait_ready(proc, url(p), bucket, timeout=30.0))  # fmt: skip
        yield url(port)
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def upload(url: str, bucket: str, name: str, data: bytes, content_type: str,
           token: str | None = None) -> None:  # fmt: skip
    request = urllib.request.Request(
        f"{url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}",
        data=data,
        method="POST",
        headers={"Content-Type": content_type, **auth(token)},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        if resp.status != 200:
            raise RuntimeError(f"upload of {name} failed: HTTP {resp.status}")


def download(url: str, bucket: str, name: str, token: str | None = None) -> bytes:
    object_url = f"{url}/storage/v1/b/{bucket}/o/{quote(name, safe='')}?alt=media"
    request = urllib.request.Request(object_url, headers=auth(token))
    with urllib.request.urlopen(request, timeout=60) as resp:
        return resp.read()


def delete(url: str, bucket: str, name: str, token: str | None = None) -> None:
    request = urllib.request.Request(
        f"{url}/storage/v1/b/{bucket}/o/{quote(name, safe='')}", method="DELETE",
        headers=auth(token),
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60):
        pass


def list_objects(url: str, bucket: str, prefix: str, token: str | None = None) -> list[dict]:
    """Every object under `prefix` ({"name", "size"}), page by page as the JSON API serves them."""
    found, page_token = [], ""
    while True:
        page = f"&pageToken={quote(page_token, safe='')}" if page_token else ""
        request = urllib.request.Request(
            f"{url}/storage/v1/b/{bucket}/o?prefix={quote(prefix, safe='')}{page}",
            headers=auth(token),
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            listing = json.loads(resp.read())
        found += [{"name": o["name"], "size": int(o.get("size", 0))}
                  for o in listing.get("items", [])]  # fmt: skip
        page_token = listing.get("nextPageToken", "")
        if not page_token:
            return found


def upload_bundle(url: str, bucket: str, bundle: Bundle, token: str | None = None) -> None:
    upload(url, bucket, bundle.object_name, bundle.data, "application/gzip", token)
