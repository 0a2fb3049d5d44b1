"""A worker whose sshd closes the connection before its banner (a VM still booting, or going
away) is a routine failure of a recovery: it reaches ops as an exception, said in one line, and
never as paramiko's traceback on stderr. In a subprocess: pytest's own logging handlers would
hide what a plain `tpupod` process prints."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent(
    """
    import sys
    if sys.argv[2] == "ops":
        import ops.fleet.ssh_connections  # what every tpupod command that reaches workers loads
    from fabric import Connection
    cxn = Connection("127.0.0.1", port=int(sys.argv[1]), connect_timeout=5,
                     connect_kwargs={"banner_timeout": 5, "look_for_keys": False,
                                     "allow_agent": False})
    try:
        cxn.open()
    except Exception as err:
        print(f"refused: {type(err).__name__}")
    """
)


def closing_listener() -> tuple[socket.socket, int]:
    """A TCP port on 127.0.0.1 that accepts and closes at once, with no banner."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def handshake(port: int, load: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(port), load], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_failed_handshake_prints_no_traceback():
    server, port = closing_listener()
    try:
        quiet = handshake(port, "ops")
        assert quiet.stdout.startswith("refused: SSHException"), quiet.stderr[-2000:]
        assert quiet.stderr == ""
        # negative control: without ops' handler, Python's last resort prints paramiko's error
        loud = handshake(port, "fabric only")
        assert loud.stdout.startswith("refused: SSHException")
        assert "Error reading SSH protocol banner" in loud.stderr and "Traceback" in loud.stderr
    finally:
        server.close()
