"""The suite reaches loopback only (the developers' guide: never any other address), enforced.

In every test process, a name lookup or a connect to anything but loopback is refused the way a
machine without that network refuses it (gaierror, ConnectionRefusedError), and recorded with the
thread that tried and what it was running; the test during which it happened then errors. A thread
a test left behind is caught too: it is charged to the test running when it tried. One made
outside any test (collection, a module or session fixture) errors the next test, or, after the
last, the session."""

from __future__ import annotations

import ipaddress
import socket
import threading
import traceback

import pytest

LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", ""}
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex
attempts: list[str] = []


def _is_loopback_host(host) -> bool:
    if host is None:
        return True
    host = host.decode() if isinstance(host, bytes) else str(host)
    host = host.strip("[]").split("%", 1)[0]
    if host in LOCAL_NAMES or host.endswith(".localhost") or host == socket.gethostname():
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or address.is_unspecified or bool(mapped and mapped.is_loopback)


def _record(what: str) -> None:
    stack = "".join(traceback.format_stack(limit=40)[:-2])
    attempts.append(f"{what} (thread {threading.current_thread().name})\n{stack}")


def _lookup(real):
    """`real` (a name lookup of the socket module) refusing and recording any name but loopback."""

    def lookup(host, *args, **kwargs):
        if not _is_loopback_host(host):
            _record(f"lookup of {host!r}")
            raise socket.gaierror(socket.EAI_NONAME, f"tests reach loopback only: {host!r} refused")
        return real(host, *args, **kwargs)

    return lookup


def _refused(sock: socket.socket, address) -> bool:
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple):
        return False
    if _is_loopback_host(address[0]):
        return False
    _record(f"connect to {address!r}")
    return True


def _connect(self, address):
    if _refused(self, address):
        raise ConnectionRefusedError(f"tests reach loopback only: {address!r} refused")
    return _real_connect(self, address)


def _connect_ex(self, address):
    if _refused(self, address):
        return 111  # ECONNREFUSED
    return _real_connect_ex(self, address)


def install() -> None:
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        setattr(socket, name, _lookup(getattr(socket, name)))
    socket.socket.connect = _connect
    socket.socket.connect_ex = _connect_ex


@pytest.fixture(autouse=True)
def _loopback_only():
    if attempts:  # made outside any test: collection, or a module or session fixture before us
        earlier = attempts[:]
        attempts.clear()
        pytest.fail(f"{len(earlier)} attempt(s) to reach beyond loopback before this test, outside "
                    f"any test; the first:\n{earlier[0]}", pytrace=False)  # fmt: skip
    before = len(attempts)
    yield
    tried = attempts[before:]
    del attempts[before:]  # charged to this test; what is left at the end was charged to none
    if tried:
        pytest.fail(f"{len(tried)} attempt(s) to reach beyond loopback during this test; the "
                    f"first:\n{tried[0]}", pytrace=False)  # fmt: skip


def uncharged_report() -> str | None:
    """Attempts made outside any test (collection, a module or session fixture): the session
    fails on them (tests/conftest.py, pytest_sessionfinish)."""
    if not attempts:
        return None
    return f"{len(attempts)} attempt(s) to reach beyond loopback outside any test; the first:\n{attempts[0]}"
