"""Exactly one watcher acts: a lease object `ops/<stack>/lease.json` in the stack's bucket.

Every write names the generation it read (`if_generation_match`; 0 = only if there is none), so of
two watchers racing for the lease one write wins and the other gets 412 Precondition Failed. The
holder renews it (its heartbeat) while it acts; anyone may take it once `expires` has passed, or at
once when the holder id is its own (the same watcher restarted by systemd). A watcher that finds
its lease rewritten by someone else stops acting at once (`LeaseLost`) and goes back to observing.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console

from ops.cloud.storage_errors import STORAGE_ERRORS
from ops.watch import journal as journal_lines
from ops.watch.remote_state import CALL_TIMEOUT, RemoteState, gexc

HOLDER_ENV = "TPUPOD_WATCH_HOLDER"


class LeaseLost(Exception):
    """Another watcher holds the lease now: stop acting."""


@dataclass(frozen=True)
class LeaseView:
    holder: str
    acquired: float
    renewed: float  # the holder's heartbeat
    expires: float
    generation: int

    def live(self, now: float | None = None) -> bool:
        return (now or time.time()) < self.expires


def default_holder() -> str:
    """A stable id for a service (the env var), else host:pid (two laptops' watches differ)."""
    return os.environ.get(HOLDER_ENV) or f"{socket.gethostname()}:{os.getpid()}"


class Lease:
    def __init__(self, state: RemoteState, holder: str, ttl: float):
        self.state, self.holder, self.ttl = state, holder, ttl
        self.generation: int | None = None  # of the lease object we last wrote
        self.acquired = 0.0
        self.renewed = 0.0

    def read(self) -> LeaseView | None:
        blob = self.state.bucket.get_blob(self.state.prefix + "lease.json", timeout=CALL_TIMEOUT)
        if blob is None:
            return None
        try:
            raw = json.loads(blob.download_as_bytes(timeout=CALL_TIMEOUT))
            return LeaseView(
                str(raw["holder"]),
                float(raw["acquired"]),
                float(raw["renewed"]),
                float(raw["expires"]),
                int(blob.generation),
            )
        except (ValueError, KeyError, TypeError):
            return LeaseView("?", 0.0, 0.0, 0.0, int(blob.generation))  # unreadable: take it

    def acquire(self) -> bool:
        """True when this watcher holds the lease now (taken or already its own)."""
        try:
            view = self.read()
        except STORAGE_ERRORS:
            return False
        now = time.time()
        if view is not None and view.live(now) and view.holder != self.holder:
            return False
        self.acquired = now
        return self._write(0 if view is None else view.generation, now)

    def renew(self, force: bool = False) -> None:
        """The heartbeat, at most every ttl/4; LeaseLost once someone else has written."""
        now = time.time()
        if not force and now - self.renewed < self.ttl / 4:
            return
        if self.generation is None:
            raise LeaseLost("the lease was never acquired")
        try:
            if self._write(self.generation, now):
                return
        except STORAGE_ERRORS:
            if now < self.renewed + self.ttl * 0.75:
                return  # the bucket is away for a moment: the lease is still ours
            raise LeaseLost("the lease could not be renewed before it expired") from None
        raise LeaseLost(f"the lease of {self.state.prefix} was taken over")

    def release(self) -> None:
        """Expire it now (holder kept, for `status`), so the next watcher need not wait."""
        if self.generation is None:
            return
        with contextlib.suppress(STORAGE_ERRORS):
            self._write(self.generation, time.time(), expires_now=True)
        self.generation = None

    def _write(self, generation: int, now: float, expires_now: bool = False) -> bool:
        record = {
            "holder": self.holder,
            "acquired": self.acquired,
            "renewed": now,
            "expires": now if expires_now else now + self.ttl,
            "ttl": self.ttl,
        }
        blob = self.state.blob("lease.json")
        try:
            blob.upload_from_string(
                json.dumps(record),
                content_type="application/json",
                if_generation_match=generation,
                timeout=CALL_TIMEOUT,
            )
        except gexc.PreconditionFailed:
            self.generation = None
            return False
        self.generation, self.renewed = int(blob.generation), now
        return True


class Observer:
    """What a watcher without the lease does: print the holder's journal as it grows."""

    def __init__(self, state: RemoteState, console: Console | None):
        self.state, self.console = state, console
        self.cursor = ""
        self.announced: str | None = None

    def start(self, last: int = 5) -> None:
        """Show the last few events once, then only new ones."""
        self.poll(last=last)

    def poll(self, view: LeaseView | None = None, last: int | None = None) -> None:
        if view is not None and view.holder != self.announced and self.console is not None:
            self.console.print(
                f"observing: lease held by {view.holder} (heartbeat "
                f"{time.time() - view.renewed:.0f}s ago); taking over if it expires",
                style="dim",
            )
            self.announced = view.holder
        try:
            records = self.state.read_journal(after=self.cursor, last=last)
        except STORAGE_ERRORS:
            return
        for name, record in records:
            self.cursor = name
            if self.console is not None:
                journal_lines.echo(self.console, record, prefix="[watcher] ")


def run_leased(
    lease: Lease,
    observer: Observer,
    act: Callable[[Callable[[], None]], int],
    poll: float,
) -> int:
    """Observe until the lease is ours, then `act(guard)` (the watch loop; it calls `guard()`
    each poll, which renews the lease or raises LeaseLost); on LeaseLost observe again."""
    observer.start()
    while True:
        if lease.acquire():
            try:
                code = act(lease.renew)
            except KeyboardInterrupt:
                lease.release()  # the next watcher need not wait for the expiry
                raise
            except LeaseLost as err:
                if observer.console is not None:
                    observer.console.print(f"lease lost: {err}; observing", style="yellow")
                continue
            lease.release()
            return code
        try:
            view = lease.read()
        except STORAGE_ERRORS:
            view = None
        observer.poll(view)
        time.sleep(poll)
