"""The pod's ports are chosen while the others are held (localpod.procs.held_ports), so no two of
its services get one number: a layout's emulator once got the JAX coordinator's port, and every
trainer start of a campaign leg failed on it."""

from __future__ import annotations

import socket

import pytest

from localpod import procs

HOSTS = ["0.0.0.0", "127.0.0.1", "127.0.0.1"]


def test_held_ports_are_distinct_and_bound_until_the_block_ends():
    with procs.held_ports(HOSTS) as ports:
        assert len(set(ports)) == len(HOSTS)
        for port in ports:  # held: nothing else can bind them meanwhile
            with socket.socket() as sock, pytest.raises(OSError):
                sock.bind(("127.0.0.1", port))
    for host, port in zip(HOSTS, ports, strict=True):  # released: theirs to bind now
        with socket.socket() as sock:
            sock.bind((host, port))


def test_a_port_released_before_the_next_is_chosen_is_not_held():
    """The negative control: the way ports were chosen before, one at a time, holds nothing."""
    port = procs.free_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # anyone may take it between the choice and its use
