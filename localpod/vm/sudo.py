"""The pod's passwordless `sudo`: a bash shim on every worker's PATH and the agent that obeys it.

A TPU VM gives the operator's login passwordless sudo. The login user ("nobody" when the pod runs
as root) cannot run the operator's Python, so the shim uses only system tools: it makes a
request directory in the worker's spool (root's, mode 1733: anyone may create, nobody may list),
with FIFOs for the command's stdin/stdout/stderr and a control FIFO, and writes the argv. The
root agent polls the spool and trusts a request only when the kernel says the login user owns it
(fstat of the directory, FIFOs and argv file opened without following links), then runs the
command as root with the worker's root environment and reports its exit status on the control
FIFO. Anyone else, or no live agent: `sudo: a password is required`, exit 1, as `sudo -n` says.
When the pod cannot switch users (run by a developer), the shim runs the command as that user.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from pathlib import Path

from localpod.vm.privilege import Login
from localpod.vm.sshserver import Spawn

POLL_S = 0.05
OPEN_TIMEOUT_S = 5.0  # for the shim's readers to open their ends of out/err
MAX_ARGV_BYTES = 1 << 20
FIFO, FILE = stat.S_IFIFO, stat.S_IFREG

SHIM = r"""#!/bin/bash
# The local pod's sudo (localpod/vm/sudo.py): passwordless for the login user, as on a TPU VM.
set -u
AGENT_PID=@AGENT_PID@
LOGIN_UID=@LOGIN_UID@
SPOOL='@SPOOL@'
SWITCHES=@SWITCHES@
refuse() { echo "sudo: a password is required" >&2; exit 1; }
usage() { echo "usage: sudo [-n] [-u root] command [arg ...]" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
  -n | -E | -H | -S | --non-interactive | --preserve-env | --set-home) shift ;;
  -u) [ "${2:-}" = root ] || { echo "sudo: unknown user ${2:-}" >&2; exit 1; }; shift 2 ;;
  --) shift; break ;;
  -*) echo "sudo: invalid option -- '${1#-}'" >&2; usage ;;
  *) break ;;
  esac
done
[ $# -gt 0 ] || usage
uid=$(id -u)
if [ "$uid" = 0 ] || { [ "$SWITCHES" = 0 ] && [ "$uid" = "$LOGIN_UID" ]; }; then exec "$@"; fi
[ "$uid" = "$LOGIN_UID" ] && [ -d "/proc/$AGENT_PID" ] || refuse
req=$(mktemp -d "$SPOOL/req.XXXXXXXXXX" 2>/dev/null) || refuse
pids=""
trap 'kill $pids 2>/dev/null; rm -rf "$req"' EXIT
mkfifo -m 600 "$req/ctl" "$req/in" "$req/out" "$req/err" || refuse
exec 4<>"$req/ctl"
cat "$req/out" & pids="$!"
cat "$req/err" >&2 & pids="$pids $!"
exec 3<&0 5<>"$req/in" # held until the agent has opened in: the FIFO keeps what we feed it
printf '%s\0' "$PWD" "$@" >"$req/argv.tmp" && mv "$req/argv.tmp" "$req/argv" || refuse
read -r -t 5 -u 4 answer || answer=""
[ "$answer" = ok ] || refuse
cat <&3 >&5 2>/dev/null & pids="$pids $!" # the only writer left: its EOF is the command's
exec 3<&- 5>&-
until read -r -t 1 -u 4 word rc; do
  [ -d "/proc/$AGENT_PID" ] || { echo "sudo: the worker agent went away" >&2; exit 1; }
done
for _ in $(seq 20); do # until out and err reached EOF (2 s at most)
  open=""
  for pid in ${pids% *}; do kill -0 "$pid" 2>/dev/null && open=1; done
  [ -n "$open" ] || break
  sleep 0.1
done
exit "$rc"
"""


def write_shim(bin_dir: Path, spool: Path, user: Login, agent_pid: int) -> Path:
    """Create the spool (root's, 1733) and `bin_dir/sudo` (0755) for this agent."""
    spool.mkdir(parents=True, exist_ok=True)
    spool.chmod(0o1733)
    bin_dir.mkdir(parents=True, exist_ok=True)
    text = (
        SHIM.replace("@AGENT_PID@", str(agent_pid))
        .replace("@LOGIN_UID@", str(user.uid))
        .replace("@SPOOL@", str(spool))
        .replace("@SWITCHES@", "1" if user.drops_root else "0")
    )
    shim = bin_dir / "sudo"
    shim.write_text(text)
    shim.chmod(0o755)
    return shim


def _open_owned(dir_fd: int, name: str, flags: int, uid: int, kind: int) -> int:
    """openat without following links; the file must be of `kind` and owned by `uid`."""
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    st = os.fstat(fd)
    if stat.S_IFMT(st.st_mode) != kind or st.st_uid != uid:
        os.close(fd)
        raise PermissionError(f"{name}: not of the expected type and owner")
    return fd


class SudoSpool:
    """Serves the shim's requests: polls the spool, runs accepted commands as root."""

    def __init__(self, spool: Path, user: Login, env: dict[str, str], spawn: Spawn) -> None:
        self.spool = spool
        self.user = user
        self.env = env
        self.spawn = spawn
        self._seen: set[str] = set()
        self._running: set[asyncio.Task] = set()  # strong references while requests run

    async def serve(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                names = {e.name for e in os.scandir(self.spool) if e.name.startswith("req.")}
                self._seen &= names
                for name in sorted(names - self._seen):
                    if self._ready(name):
                        self._seen.add(name)
                        task = asyncio.ensure_future(self._handle(name))
                        self._running.add(task)
                        task.add_done_callback(self._running.discard)
            await asyncio.sleep(POLL_S)

    def _ready(self, name: str) -> bool:
        return os.path.lexists(self.spool / name / "argv")

    async def _handle(self, name: str) -> None:
        fds: list[int] = []  # ours until the end
        streams: list[int] = []  # the command's stdin, stdout, stderr: handed over at spawn
        try:
            dir_fd = os.open(self.spool / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            fds.append(dir_fd)
            if os.fstat(dir_fd).st_uid != self.user.uid:
                return  # not the login user: ignored, the shim refuses after its wait
            uid = self.user.uid
            ctl = _open_owned(dir_fd, "ctl", os.O_WRONLY | os.O_NONBLOCK, uid, FIFO)
            fds.append(ctl)
            # O_NONBLOCK: a FIFO planted as argv must not hang the agent in open().
            argv_fd = _open_owned(dir_fd, "argv", os.O_RDONLY | os.O_NONBLOCK, uid, FILE)
            fds.append(argv_fd)
            cwd, *argv = os.read(argv_fd, MAX_ARGV_BYTES).decode().split("\0")[:-1]
            if not argv:
                return
            streams.append(_open_owned(dir_fd, "in", os.O_RDONLY | os.O_NONBLOCK, uid, FIFO))
            os.write(ctl, b"ok\n")  # the shim now hands its end of `in` to its stdin feeder
            streams.append(await self._open_writer(dir_fd, "out"))
            streams.append(await self._open_writer(dir_fd, "err"))
            for fd in streams:
                os.set_blocking(fd, True)
            code = await self._run(argv, cwd, streams)
            os.write(ctl, f"exit {code}\n".encode())
        except (OSError, UnicodeDecodeError, ValueError):
            pass  # the shim went away or the request was malformed: it reports its own failure
        finally:
            for fd in (*fds, *streams):
                with contextlib.suppress(OSError):
                    os.close(fd)

    async def _open_writer(self, dir_fd: int, name: str) -> int:
        """Our write end of out/err, once the shim's reader has opened its end."""
        deadline = asyncio.get_running_loop().time() + OPEN_TIMEOUT_S
        flags = os.O_WRONLY | os.O_NONBLOCK
        while True:
            try:
                return _open_owned(dir_fd, name, flags, self.user.uid, FIFO)
            except OSError as err:
                if err.errno != errno.ENXIO or asyncio.get_running_loop().time() > deadline:
                    raise
            await asyncio.sleep(0.02)

    async def _run(self, argv: list[str], cwd: str, streams: list[int]) -> int:
        """Run argv as root on `streams` (closed here once the command has them)."""
        env = {
            **self.env,
            "USER": "root",
            "LOGNAME": "root",
            "SUDO_USER": self.user.name,
            "SUDO_UID": str(self.user.uid),
            "SUDO_GID": str(self.user.gid),
            "SUDO_COMMAND": " ".join(argv),
        }
        workdir = Path(cwd) if os.path.isdir(cwd) else Path("/")
        stdin, out, err = streams
        try:
            _, exited = self.spawn(argv, env, workdir, stdin=stdin, stdout=out, stderr=err)
        except (FileNotFoundError, PermissionError):
            os.write(err, f"sudo: {argv[0]}: command not found\n".encode())
            return 1
        finally:
            while streams:  # the command's now: its exit is the shim's EOF
                os.close(streams.pop())
        code = await exited
        return code if code >= 0 else 128 - code
