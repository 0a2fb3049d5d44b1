"""Fabric connections as the workers' fan-out opens them (ops.fleet.workers): channel opens
bounded by the connect timeout, host keys pinned to the guest attributes, the SSH errors said in
one line, and closing that reaps each IAP ProxyCommand."""

from __future__ import annotations

import base64
import logging
import os
import socket
import subprocess
import time
from select import select

from fabric import Connection
from paramiko import BadHostKeyException, Ed25519Key, RejectPolicy, SSHException
from paramiko.proxy import ProxyCommand, ProxyCommandFailure

from ops.cloud.slice import Worker

# paramiko logs a failed handshake (a worker's sshd not up yet, a VM going away) at ERROR, with
# its traceback, and with no handler configured Python prints that on stderr: tracebacks in the
# middle of `tpupod watch` and `tpupod demo` for what is routine in a recovery. The failure
# reaches the caller as an exception, said in one line (describe_error) and retried; the
# NullHandler stops the last-resort print only (a program's own logging config still sees them).
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class BoundedConnection(Connection):
    """A connection whose channel opens are bounded by its connect timeout. paramiko waits up to
    an hour for a session on a transport whose peer vanished without a FIN (a preempted VM,
    an IAP tunnel to it), and a command's own timeout starts only once its session is open: a
    probe racing a preemption held the watch with it."""

    def open(self):
        result = super().open()
        if self.transport is not None:
            self.transport.channel_timeout = self.connect_timeout
        return result

    def open_gateway(self):
        sock = super().open_gateway()
        if type(sock) is ProxyCommand:  # the gateway is a command line (IAP): see EndingProxy
            sock.__class__ = EndingProxyCommand
        return sock


class EndingProxyCommand(ProxyCommand):
    """paramiko's ProxyCommand reads its program's end of output as "nothing yet": once the
    proxy ends (the VM went away, its IAP tunnel closed) the transport's thread spins on it, and
    every session on that transport waits forever for an answer (a watch's probe that raced a
    preemption held the watch, found by the recovery bench). Here it is the socket's end, as for
    a real socket: recv gives b"", paramiko's packetizer raises EOFError, the transport ends and
    its channels wake with an error."""

    def recv(self, size: int) -> bytes:
        start = time.monotonic()
        while True:
            left = None if self.timeout is None else self.timeout - (time.monotonic() - start)
            if left is not None and left <= 0:
                raise TimeoutError()  # socket.timeout, as paramiko expects
            ready, _, _ = select([self.process.stdout], [], [], left)
            if ready:
                try:
                    return os.read(self.process.stdout.fileno(), size)  # b"": the proxy ended
                except OSError as err:
                    raise ProxyCommandFailure(" ".join(self.cmd), err.strerror) from None


def pinned(cxn: Connection, worker: Worker) -> Connection:
    """Only the guest-attribute host key is accepted, under the name paramiko looks it up by
    (`host` on port 22, `[host]:port` otherwise); Fabric's default AutoAddPolicy is replaced."""
    cxn.client.set_missing_host_key_policy(RejectPolicy())
    if worker.host_key:
        name = worker.host if worker.port == 22 else f"[{worker.host}]:{worker.port}"
        key = Ed25519Key(data=base64.b64decode(worker.host_key))
        cxn.client.get_host_keys().add(name, key.get_name(), key)
    return cxn


def connect_kwargs(worker: Worker, connect_timeout: float) -> dict:
    """The SSH banner is bounded like the connect: a live sshd sends it at once, and a tunnel to
    a VM that is going away (IAP accepts, nothing answers) would otherwise hold each attempt
    for paramiko's banner wait."""
    kwargs: dict = {"banner_timeout": connect_timeout, "auth_timeout": 30}
    if worker.key_filename:
        kwargs.update(key_filename=worker.key_filename, look_for_keys=False, allow_agent=False)
    return kwargs


def host_key_refused(err: BaseException) -> bool:
    return isinstance(err, BadHostKeyException) or (
        isinstance(err, SSHException) and "not found in known_hosts" in str(err)
    )


def describe_error(err: BaseException, worker: Worker) -> str:
    if isinstance(err, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(err, BadHostKeyException):
        return (
            f"host key of {worker.host} does not match the one in the node's guest attributes "
            f"(got ...{err.key.get_base64()[-8:]}, expected ...{(worker.host_key or '')[-8:]}): "
            "refused; a different machine answered, or the node was recreated (describe again)"
        )
    if host_key_refused(err):
        return (
            f"{worker.host}: no host key in the node's guest attributes: refused (a worker "
            "publishes it at boot; if none ever does, the org policy "
            "constraints/compute.disableGuestAttributesAccess may be enforced: ask for an "
            "exception for this project)"
        )
    return f"{type(err).__name__}: {err}".strip().splitlines()[0][:200]


def close_connections(*cxns: Connection) -> None:
    """Closes SSH connections and reaps their ProxyCommands (paramiko only signals them): without
    the wait, a watch that runs for days keeps one zombie per connection it ever opened. Each
    transport's thread is joined first, because it signals its proxy once more on its way out:
    after the reap that pid may already be free, or someone else's. A proxy whose thread is still
    alive after the wait is left unreaped."""
    closing = []
    for cxn in cxns:
        transport = cxn.client.get_transport()  # also a broken one: its proxy needs reaping too
        cxn.close()  # SIGTERM to the proxy; its EOF ends the transport's thread
        if getattr(getattr(transport, "sock", None), "process", None) is not None:
            closing.append(transport)
    for transport in closing:
        if transport.is_alive():  # never started if connecting failed before the handshake
            transport.join(timeout=5)
            if transport.is_alive():
                continue
        process = transport.sock.process
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
