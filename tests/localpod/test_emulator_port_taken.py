"""A storage emulator whose port another process took between its pick and its bind ends at once
with EADDRINUSE, and its starter says so (PortTaken) instead of waiting out its readiness
deadline: CI once lost a pod test to a 60 s wait on an emulator whose listener had died."""

from __future__ import annotations

import socket
import time

import pytest

from localpod.gcp import storage


def test_a_taken_port_ends_the_emulator_at_once(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as thief:
        thief.bind(("127.0.0.1", 0))
        thief.listen()
        port = thief.getsockname()[1]
        proc = storage.start_emulator(port, "tpupod-taken", tmp_path / "data", tmp_path / "log")
        try:
            began = time.monotonic()
            with pytest.raises(storage.PortTaken, match="port was taken"):
                storage.wait_ready(proc, f"http://127.0.0.1:{port}", "tpupod-taken", timeout=60)
            assert time.monotonic() - began < 30  # the process's exit, not the deadline
            assert "cannot listen on port" in (tmp_path / "log").read_text()
        finally:
            proc.kill()
            proc.wait(timeout=10)


def test_an_emulator_on_a_free_port_still_starts():  # the control: no port taken, no PortTaken
    with storage.running_emulator("tpupod-free") as url:
        assert url.startswith("http://127.0.0.1:")


def test_an_emulator_whose_port_was_taken_serves_on_one_picked_anew(tmp_path):
    """The retry both the pod's controller and running_emulator start through: the first start
    finds its port taken, the second serves the bucket on another port."""
    started = []

    def start(port: int):
        started.append(storage.start_emulator(port, "tpupod-moved", tmp_path / "data",
                                              tmp_path / "log"))  # fmt: skip
        return started[-1]

    def wait(proc, port: int) -> None:
        storage.wait_ready(proc, f"http://127.0.0.1:{port}", "tpupod-moved", timeout=60)

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as thief:
        thief.bind(("127.0.0.1", 0))
        thief.listen()
        taken = thief.getsockname()[1]
        try:
            port = storage.ready_on_a_free_port(start(taken), taken, start, wait)
            assert port != taken and len(started) == 2
            assert started[0].returncode is not None and started[1].poll() is None
            assert storage.list_objects(f"http://127.0.0.1:{port}", "tpupod-moved", "") == []
        finally:
            for proc in started:
                proc.kill()
                proc.wait(timeout=10)
