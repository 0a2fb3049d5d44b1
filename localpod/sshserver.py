"""A worker's SSH server (asyncssh): key auth only, commands run with bash in the worker's env.

This stands in for a TPU VM's sshd, so Fabric connects exactly as it would on GCP: the same
client, keys and commands. Sessions get the worker environment (HOME, TPUPOD_ROOT, the metadata
and storage endpoints), like a login on the VM would.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncssh

# How long output may keep arriving after the command exited (a background child that kept the
# pipe open); OpenSSH waits for EOF forever, which hangs clients for no benefit here.
OUTPUT_GRACE_S = 2.0
_CHUNK = 65536

# spawn(argv, env, cwd) -> the process and a future with its exit code (the agent reaps children).
Spawn = Callable[[list[str], dict[str, str], Path], tuple[subprocess.Popen, Awaitable[int]]]


def generate_keys(client_key: Path, host_key: Path) -> None:
    """The pod's client key pair (what ops connects with) and its host key, if missing."""
    for path in (client_key, host_key):
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        key = asyncssh.generate_private_key("ssh-ed25519", comment="tpupod-local")
        key.write_private_key(path, "openssh")
        key.write_public_key(path.with_name(path.name + ".pub"), "openssh")
        path.chmod(0o600)


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
        pass  # the client went away: closing our end gives the command EPIPE, as with sshd
    finally:
        transport.close()


async def _pump_in(reader: asyncssh.SSHReader, pipe) -> None:
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(_CHUNK):
            await loop.run_in_executor(None, pipe.write, data)
            await loop.run_in_executor(None, pipe.flush)
    except (BrokenPipeError, OSError, asyncssh.Error):
        pass
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


def make_handler(env: dict[str, str], home: Path, spawn: Spawn):
    async def handle(process: asyncssh.SSHServerProcess) -> None:
        session_env = {**env, **{_text(k): _text(v) for k, v in process.env.items()}}
        command = process.command
        argv = ["bash", "-c", command] if command is not None else ["bash"]
        popen, exited = spawn(argv, session_env, home)
        pumps = [
            asyncio.ensure_future(_pump_out(popen.stdout, process.stdout)),
            asyncio.ensure_future(_pump_out(popen.stderr, process.stderr)),
        ]
        feeder = asyncio.ensure_future(_pump_in(process.stdin, popen.stdin))
        code = await exited
        _, pending = await asyncio.wait(pumps, timeout=OUTPUT_GRACE_S)
        for task in (*pending, feeder):
            task.cancel()
        with contextlib.suppress(OSError, asyncssh.Error):
            process.exit(code if code >= 0 else 128 - code)

    return handle


async def serve(
    host: str,
    port: int,
    *,
    host_key: Path,
    authorized_keys: Path,
    env: dict[str, str],
    home: Path,
    spawn: Spawn,
) -> asyncssh.SSHAcceptor:
    """Listen on host:port; the caller keeps the acceptor and closes it at shutdown."""
    return await asyncssh.listen(
        host,
        port,
        server_host_keys=[str(host_key)],
        authorized_client_keys=str(authorized_keys),
        process_factory=make_handler(env, home, spawn),
        encoding=None,
        sftp_factory=True,
        allow_scp=True,
        password_auth=False,
        kbdint_auth=False,
        x11_forwarding=False,
        agent_forwarding=False,
    )
