"""Fixtures for ops tests: a real SSH server on loopback (asyncssh, commands run by bash)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import asyncssh
import pytest


class LoopbackSSHD:
    """Runs commands with `TPUPOD_ROOT=root`; key auth only; stop() closes everything."""

    def __init__(self, root: Path, keydir: Path, port: int = 0):
        self.root, self.port = root, port
        key = asyncssh.generate_private_key("ssh-ed25519")
        self.key_file = keydir / "id_ed25519"
        key.write_private_key(self.key_file)
        os.chmod(self.key_file, 0o600)
        self._client_key = key
        self._host_key = asyncssh.generate_private_key("ssh-ed25519")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server = None
        self.commands: list[str] = []

    @property
    def host_key(self) -> str:
        """The base64 public host key, as guest attributes publish it."""
        return self._host_key.export_public_key("openssh").decode().split()[1]

    def start(self) -> LoopbackSSHD:
        if not self._thread.is_alive():
            self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self._server = fut.result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _start(self):
        keys = asyncssh.import_authorized_keys(self._client_key.export_public_key().decode())
        return await asyncssh.create_server(
            asyncssh.SSHServer,
            "127.0.0.1",
            self.port,
            server_host_keys=[self._host_key],
            authorized_client_keys=keys,
            process_factory=self._handle,
        )

    async def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        self.commands.append(process.command or "")
        env = {**os.environ, "TPUPOD_ROOT": str(self.root)}
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", process.command or "true", env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip

        async def pump(source, sink):
            while chunk := await source.read(4096):
                sink.write(chunk.decode(errors="replace"))

        try:
            await asyncio.gather(
                pump(proc.stdout, process.stdout), pump(proc.stderr, process.stderr)
            )
            process.exit(await proc.wait())
        except (asyncio.CancelledError, asyncssh.Error, OSError):
            if proc.returncode is None:
                os.killpg(proc.pid, 15)
            raise

    def stop_listening(self) -> None:
        """Closes the listener (new connections fail) but keeps the loop for a later start()."""
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._close(self._server), self._loop).result(10)
            self._server = None

    @staticmethod
    async def _close(server) -> None:
        """On the loop's thread: asyncio's Server is not thread-safe, and a close() from the test's
        thread raced a connection's detach, both waking the waiters (CI stop 63's teardown error)."""
        server.close()
        await server.wait_closed()

    def stop(self) -> None:
        self.stop_listening()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def pod(tmp_path):
    """Two SSH workers on loopback, each with its own TPUPOD_ROOT."""
    servers = []
    for i in range(2):
        root = tmp_path / f"w{i}"
        root.mkdir()
        servers.append(LoopbackSSHD(root, root).start())
    yield servers
    for server in servers:
        server.stop()


def dummy_token() -> str:
    """A token file for a Target whose API is a dead or silent port: what a client sends there
    does not matter, only that it is given one (ops.cloud.credentials reads it)."""
    import tempfile

    path = Path(tempfile.gettempdir()) / f"tpupod-test-token-{os.getuid()}"
    if not path.exists():  # xdist workers may race here: each writes whole, then renames
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text("ya29.not-a-real-token\n")
        os.replace(tmp, path)
    return str(path)
