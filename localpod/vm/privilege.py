"""Who the operator is on a worker, and the root/login split a TPU VM has.

On GCP the startup script and the trainer run as root and the operator logs in as an
unprivileged user with passwordless sudo. A pod run as root reproduces that: logins run as the
existing unprivileged user "nobody" (never created, /etc never edited). A pod run by a developer
cannot switch users, so the login is that developer and the pod's sudo runs commands as them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import getpass
import os
import pwd
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LOGIN_USER_WHEN_ROOT = "nobody"


@dataclass(frozen=True)
class Login:
    """The operator's login identity on a worker."""

    name: str
    uid: int
    gid: int

    @property
    def drops_root(self) -> bool:
        """True when the pod runs as root and logins run as someone else."""
        return os.geteuid() == 0 and self.uid != 0


def login_user() -> str:
    """The login user name ops connects as (endpoints.json `ssh.user`)."""
    return login().name


def login() -> Login:
    if os.geteuid() == 0:
        entry = pwd.getpwnam(LOGIN_USER_WHEN_ROOT)
        return Login(entry.pw_name, entry.pw_uid, entry.pw_gid)
    return Login(getpass.getuser(), os.getuid(), os.getgid())


def run_as(user: Login) -> dict:
    """Popen keyword arguments that start a process as `user` (nothing when we cannot switch)."""
    if not user.drops_root:
        return {}
    return {"user": user.uid, "group": user.gid, "extra_groups": []}


def give(path: Path, user: Login, mode: int | None = None) -> None:
    """Make `path` (not following links) the login user's, optionally with `mode`."""
    if user.drops_root:
        os.chown(path, user.uid, user.gid, follow_symlinks=False)
    if mode is not None:
        path.chmod(mode)


def give_tree(root: Path, user: Login) -> None:
    """`root` and everything under it become the login user's (a new HOME)."""
    if not user.drops_root:
        return
    give(root, user)
    for parent, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            give(Path(parent) / name, user)


def open_traverse(path: Path, user: Login) -> list[Path]:
    """Give others the search (x) bit on `path` and its ancestors that lack it, so the login
    user can reach its HOME under a private dir (pytest's 0700 tmp dirs); never read or write.
    Returns the dirs changed."""
    if not user.drops_root:
        return []
    changed = []
    for directory in [path, *path.parents]:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
            changed.append(directory)
    return changed


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


@contextlib.contextmanager
def filesystem_identity(user: Login) -> Iterator[None]:
    """File access in this thread checked as `user` (Linux setfsuid/setfsgid are per thread and
    drop root's file capabilities while set), for file servers run inside the root agent."""
    if not user.drops_root:
        yield
        return
    _libc.setfsgid(user.gid)
    _libc.setfsuid(user.uid)
    try:
        yield
    finally:
        _libc.setfsuid(0)
        _libc.setfsgid(0)
