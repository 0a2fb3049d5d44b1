"""The suite's loopback guard (tests/loopback_only.py) refuses and records what goes beyond
loopback, and lets loopback through."""

from __future__ import annotations

import socket

import loopback_only
import pytest


def _take_attempts(before: int) -> list[str]:
    taken = loopback_only.attempts[before:]
    del loopback_only.attempts[before:]
    return taken


def test_a_lookup_or_connect_beyond_loopback_is_refused_and_recorded():
    before = len(loopback_only.attempts)
    with pytest.raises(socket.gaierror, match="loopback only"):
        socket.getaddrinfo("storage.googleapis.com", 443)
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("169.254.169.254", 80))
    with socket.socket() as s:
        assert s.connect_ex(("10.0.0.1", 80)) != 0
    taken = _take_attempts(before)
    assert [t.split(" (thread")[0] for t in taken] == [
        "lookup of 'storage.googleapis.com'", "connect to ('169.254.169.254', 80)",
        "connect to ('10.0.0.1', 80)"]  # fmt: skip


def test_loopback_goes_through():
    before = len(loopback_only.attempts)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        for host in ("localhost", "127.0.0.1", "127.0.0.5"):
            socket.getaddrinfo(host, server.getsockname()[1])
        with socket.create_connection(("localhost", server.getsockname()[1]), timeout=5):
            pass
    assert _take_attempts(before) == []


def test_ipv4_mapped_loopback_and_the_other_lookups():
    before = len(loopback_only.attempts)
    assert loopback_only._is_loopback_host("::ffff:127.0.0.1")
    assert not loopback_only._is_loopback_host("::ffff:10.0.0.1")
    with pytest.raises(socket.gaierror):
        socket.gethostbyname("metadata.google.internal")
    with pytest.raises(socket.gaierror):
        socket.gethostbyname_ex("storage.googleapis.com")
    assert socket.gethostbyname("localhost").startswith("127.")
    assert len(_take_attempts(before)) == 2
