"""Process and port facts from /proc, so the pod signals only processes it started.

Workers detach their trainers with setsid, so a process group is not enough to find them: the
worker agent is a child subreaper and the pod walks the parent links below it instead. Every pid
is paired with its start time, so a recycled pid is never mistaken for one of ours.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
_LISTEN = "0A"


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    start: int


def read_proc(pid: int) -> Proc | None:
    """One process's stat line, or None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return Proc(pid=pid, ppid=int(fields[1]), state=fields[0], start=int(fields[19]))


def start_time(pid: int) -> int | None:
    proc = read_proc(pid)
    return proc.start if proc else None


def alive(pid: int, start: int | None = None) -> bool:
    """Running (not a zombie) and, when `start` is given, still the same process."""
    proc = read_proc(pid)
    return proc is not None and proc.state != "Z" and (start is None or proc.start == start)


def all_procs() -> list[Proc]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := read_proc(int(entry))):
            found.append(proc)
    return found


def descendants(root: int, procs: list[Proc] | None = None) -> list[Proc]:
    """Every live process below `root` (not `root` itself), parents before children."""
    children: dict[int, list[Proc]] = {}
    for proc in all_procs() if procs is None else procs:
        children.setdefault(proc.ppid, []).append(proc)
    found: list[Proc] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child.pid)
    return [p for p in found if p.state != "Z"]


def send(procs: list[Proc], sig: int) -> None:
    """Signal each process that is still the one we saw."""
    for proc in procs:
        if alive(proc.pid, proc.start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, sig)


def kill_tree(root: int, *, include_root: bool, grace: float = 0.0, rounds: int = 20) -> None:
    """SIGTERM the tree below `root`, wait up to `grace`, then SIGKILL until nothing is left.

    Repeated rounds catch children forked while we were signalling.
    """
    if grace > 0:
        send(descendants(root), signal.SIGTERM)
        deadline = time.monotonic() + grace
        while descendants(root) and time.monotonic() < deadline:
            time.sleep(0.05)
    for _ in range(rounds):
        below = descendants(root)
        if not below:
            break
        send(below, signal.SIGCONT)  # a stopped process still dies on SIGKILL; be explicit
        send(below, signal.SIGKILL)
        time.sleep(0.02)
    if include_root:
        with contextlib.suppress(ProcessLookupError):
            os.kill(root, signal.SIGKILL)


def wait_gone(pid: int, start: int | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid, start):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def set_subreaper() -> None:
    """Orphans below this process are re-parented to it instead of init (Linux >= 3.4)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def reap_zombies(skip: set[int]) -> None:
    """Reap exited orphans re-parented to us, leaving the children someone else waits for."""
    me = os.getpid()
    for proc in all_procs():
        if proc.ppid == me and proc.state == "Z" and proc.pid not in skip:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, os.WNOHANG)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def held_ports(hosts: list[str]):
    """Ports free on each host, all bound until the block ends: a port picked, released and then
    picked again hands two of the pod's services one number (the storage emulator once got the
    JAX coordinator's, and every trainer start failed on it). Choose every other port inside."""
    socks = []
    try:
        for host in hosts:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((host, 0))
        yield [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port_on_all(hosts: list[str], attempts: int = 50) -> int:
    """One port number free on every address (the metadata server listens on each)."""
    for _ in range(attempts):
        port = free_port(hosts[0])
        socks = []
        try:
            for host in hosts:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind((host, port))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise OSError(f"no port free on all of {hosts}")


def listening() -> set[tuple[str, int]]:
    """(address, port) of every IPv4 TCP socket in LISTEN state on this machine."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] != _LISTEN:
            continue
        hex_ip, hex_port = fields[1].split(":")
        ip = socket.inet_ntoa(int(hex_ip, 16).to_bytes(4, "little"))
        found.add((ip, int(hex_port, 16)))
    return found
