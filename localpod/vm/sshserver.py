"""A worker's SSH server (asyncssh) standing in for a TPU VM's sshd.

Key auth for the one login user it was configured for (any other name is refused); each
session's command runs with bash as that user (never root when the pod runs as root), with the
worker's environment plus HOME, USER and LOGNAME, in its own session like sshd's, and under a pty
when the client asks for one. SFTP and scp (OpenSSH's scp speaks SFTP) run inside the agent
with file access checked as the login user. Fabric and OpenSSH connect exactly as on GCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import struct
import subprocess
import termios
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncssh

from localpod.gcp import oslogin
from localpod.vm.privilege import Login, filesystem_identity, open_traverse, run_as

# How long output may keep arriving after the command exited (a background child that kept the
# pipe open); OpenSSH waits for EOF forever, which hangs clients for no benefit here.
OUTPUT_GRACE_S = 2.0
_CHUNK = 65536

# spawn(argv, env, cwd, **popen_kwargs) -> the process and a future with its exit code.
Spawn = Callable[..., tuple[subprocess.Popen, Awaitable[int]]]


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


async def _pump_out(pipe, writer: asyncssh.SSHWriter) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncssh.Error):
        pass  # the client went away (or a pty's EIO): closing our end gives the command EPIPE
    finally:
        transport.close()


async def _pump_in(reader: asyncssh.SSHReader, pipe, on_resize=None) -> None:
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                data = await reader.read(_CHUNK)
            except asyncssh.TerminalSizeChanged as change:
                if on_resize:
                    on_resize(change.width, change.height)
                continue
            if not data:
                break
            await loop.run_in_executor(None, pipe.write, data)
            await loop.run_in_executor(None, pipe.flush)
    except (BrokenPipeError, OSError, asyncssh.Error):
        pass
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


def _set_size(fd: int, width: int, height: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))


def _take_terminal() -> None:
    """In the child (after setsid): its stdin, the pty, becomes its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _keep_home_reachable(home: Path, user: Login) -> None:
    """Re-open the path to HOME at every session: pytest resets its 0700 base dir whenever
    another session starts, which would lock the login user out of a running pod."""
    with contextlib.suppress(OSError):
        open_traverse(home, user)


def session_env(env: dict[str, str], user: Login, home: Path, client: dict) -> dict[str, str]:
    """What a login on the VM sees: the worker's environment, the client's variables, and the
    login's own identity (which the client cannot override)."""
    identity = {"HOME": str(home), "USER": user.name, "LOGNAME": user.name}
    return {**env, **{_text(k): _text(v) for k, v in client.items()}, **identity}


def make_handler(env: dict[str, str], home: Path, spawn: Spawn, user: Login):
    async def handle(process: asyncssh.SSHServerProcess) -> None:
        try:
            await run_session(process)
        except (OSError, subprocess.SubprocessError) as err:  # e.g. HOME unreachable
            with contextlib.suppress(OSError, asyncssh.Error):
                process.stderr.write(f"cannot start the session: {err}\n".encode())
                process.exit(1)

    async def run_session(process: asyncssh.SSHServerProcess) -> None:
        _keep_home_reachable(home, user)
        command = process.command
        argv = ["bash", "-c", command] if command is not None else ["bash", "-l"]
        child_env = session_env(env, user, home, dict(process.env))
        options = {"start_new_session": True, **run_as(user)}
        pty = None
        if process.term_type:  # the client asked for a pty: the command gets one, as with sshd
            child_env["TERM"] = process.term_type
            master, slave = os.openpty()
            if user.drops_root:  # the login's own terminal, as sshd chowns it
                os.fchown(slave, user.uid, user.gid)
                os.fchmod(slave, 0o620)
            width, height, _, _ = process.get_terminal_size()
            _set_size(master, width or 80, height or 24)
            streams = {"stdin": slave, "stdout": slave, "stderr": slave}
            options |= {**streams, "preexec_fn": _take_terminal}
            popen, exited = spawn(argv, child_env, home, **options)
            os.close(slave)
            pty = os.fdopen(master, "r+b", buffering=0)
            outputs = [(pty, process.stdout)]
            feed = os.fdopen(os.dup(master), "wb", buffering=0)  # EOF must not close the pty
        else:
            popen, exited = spawn(argv, child_env, home, **options)
            outputs = [(popen.stdout, process.stdout), (popen.stderr, process.stderr)]
            feed = popen.stdin
        resize = (lambda w, h: _set_size(pty.fileno(), w, h)) if pty else None
        pumps = [asyncio.ensure_future(_pump_out(src, dst)) for src, dst in outputs]
        feeder = asyncio.ensure_future(_pump_in(process.stdin, feed, resize))
        code = await exited
        _, pending = await asyncio.wait(pumps, timeout=OUTPUT_GRACE_S)
        for task in (*pending, feeder):
            task.cancel()
        if pty is not None:
            with contextlib.suppress(OSError):
                pty.close()
        with contextlib.suppress(OSError, asyncssh.Error):
            process.exit(code if code >= 0 else 128 - code)

    return handle


class _LoginServer(asyncssh.SSHServer):
    """Public-key auth for the configured login user only: other names get no keys to match."""

    def __init__(self, user: Login, authorized_keys: Path) -> None:
        self._user = user
        self._authorized_keys = authorized_keys
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn

    def begin_auth(self, username: str) -> bool:
        if username == self._user.name and self._conn is not None:
            self._conn.set_authorized_keys(str(self._authorized_keys))
        elif self._conn is not None and (
            imported := oslogin.authorized_keys_for(username, instance=socket.gethostname())
        ):
            # OS Login: a service account's POSIX user, with the keys it imported (only those)
            self._conn.set_authorized_keys(str(imported))
        return True

    def public_key_auth_supported(self) -> bool:
        return True


_SFTP_FILE_OPS = (
    "open", "open56", "close", "read", "write", "lstat", "fstat", "setstat", "lsetstat",
    "fsetstat", "remove", "mkdir", "rmdir", "realpath", "stat", "rename", "posix_rename",
    "readlink", "symlink", "link", "statvfs", "fstatvfs", "fsync", "lock", "unlock",
)  # fmt: skip


def login_sftp_server(user: Login, home: Path) -> type[asyncssh.SFTPServer]:
    """An SFTP server class whose every file operation runs with the login user's file identity
    (scp uses it too); paths are relative to HOME, as with OpenSSH's sftp-server."""

    class LoginSFTPServer(asyncssh.SFTPServer):
        def __init__(self, chan: asyncssh.SSHServerChannel) -> None:
            super().__init__(chan)
            _keep_home_reachable(home, user)

        def map_path(self, path: bytes) -> bytes:
            return super().map_path(os.path.join(os.fsencode(home), path))

        def exit(self) -> None:
            """Report exit status 0 when the client ends an SFTP session, as sftp-server does
            (asyncssh closes without one, and OpenSSH's scp then exits 1)."""
            if self.channel.get_subsystem() == "sftp":
                with contextlib.suppress(OSError):
                    self.channel.exit(0)

        async def scandir(self, path: bytes):
            for name in (b".", b".."):
                yield await self._to_sftpname(path, name)
            with filesystem_identity(user), os.scandir(self.map_path(path)) as entries:
                found = [(os.fsencode(e.name), e.stat(follow_symlinks=False)) for e in entries]
            for name, stats in found:
                yield asyncssh.SFTPName(name, attrs=asyncssh.SFTPAttrs.from_local(stats))

    def as_login(op: str):
        base = getattr(asyncssh.SFTPServer, op)

        def run(self, *args, **kwargs):
            with filesystem_identity(user):
                return base(self, *args, **kwargs)

        return run

    for op in _SFTP_FILE_OPS:
        setattr(LoginSFTPServer, op, as_login(op))
    return LoginSFTPServer


async def serve(
    host: str,
    port: int,
    *,
    host_key: Path,
    authorized_keys: Path,
    env: dict[str, str],
    home: Path,
    spawn: Spawn,
    user: Login,
) -> asyncssh.SSHAcceptor:
    """Listen on host:port; the caller keeps the acceptor and closes it at shutdown."""
    return await asyncssh.listen(
        host,
        port,
        server_factory=lambda: _LoginServer(user, authorized_keys),
        server_host_keys=[str(host_key)],
        process_factory=make_handler(env, home, spawn, user),
        encoding=None,
        sftp_factory=login_sftp_server(user, home),
        allow_scp=True,
        password_auth=False,
        kbdint_auth=False,
        x11_forwarding=False,
        agent_forwarding=False,
    )
