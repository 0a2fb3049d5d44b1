"""The old disks of recreated workers, deleted only while every worker's job trains.

A create moves each old worker directory aside at once (a rename) instead of deleting it: on
GCP an old VM's disk goes away on Google's side, never on the new VM's CPU or disk. Deleting it
here right away (its uv cache and .venv: ~15,000 files, ~1 GB a worker) put the test bed's own
disk work inside the new workers' boots, which unpack as much: a cost GCP has not, in every
cold-recreate figure (a low CPU priority does not keep it out: ext4's journal is shared, and
`ionice -c 3` means nothing to mq-deadline). How much it cost is not separable here from this
machine's disk, which throttles sustained writes (README, *Known limits*). So the pod deletes
its trash while it is quiet: every worker booted and its job training (status.json fresh and
not starting, restoring or compiling after a boot, a crash or a hang), with an `rm` stopped
within POLL_S as soon as that ends. An entry waiting longer than MAX_WAIT_S is deleted anyway,
so a pod whose job never trains cannot fill the disk; one that `rm` cannot delete is set aside
in trash/.stuck (said once on stderr), never retried in a loop. The workers' memory a stopped
VM lost (localpod.vm.memory) waits in the pod memory's own trash the same way: on GCP a VM's RAM
is gone with it, not freed by the next VMs' CPU while they boot (at once, and first, when the
memory left is below what a boot needs: MEMORY_FLOOR_BYTES).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from contract.status import JobState, parse_status
from localpod.state import PodPaths
from localpod.vm import memory

FRESH_S = 5.0  # the trainer's status heartbeat comes every 2 s (trainer.config)
MAX_WAIT_S = 120.0
# Below this much free memory (the bootstrap's TPUPOD_RAM_MIN_FREE_MB, 4096) a stopped VM's
# memory is freed at once: the next boots would otherwise unpack onto the disk, or run out.
MEMORY_FLOOR_BYTES = 4096 << 20
POLL_S = 0.1  # how soon a boot that begins stops the deletion
RM = ("nice", "-n", "19", "rm", "-rf", "--one-file-system")
STUCK = ".stuck"  # under trash/: what rm could not delete


def move_to_trash(root: Path, path: Path) -> Path | None:
    """Rename `path` into the pod's trash (instant: same filesystem); None if it is absent."""
    if not path.exists():
        return None
    trash = root / "trash" / f"{path.name}-{time.time_ns()}"
    trash.parent.mkdir(exist_ok=True)
    path.rename(trash)
    return trash


def trashed_at(entry: Path) -> float:
    """When move_to_trash renamed `entry` (its name's suffix), in seconds since the epoch."""
    try:
        return int(entry.name.rsplit("-", 1)[1]) / 1e9
    except (IndexError, ValueError):
        return 0.0  # not ours: oldest, and past any wait


def workers_quiet(paths: PodPaths, now: float | None = None) -> bool:
    """Every worker of the pod booted (bootstrap.json `ok`) and its job trains: its status file
    (contract.status, as the watch reads it) written within FRESH_S, training or saving. A
    worker without them is booting, or its job starting or stopped: not quiet."""
    now = time.time() if now is None else now
    for worker in (paths.root / "workers").glob("*"):
        if not worker.is_dir() or not worker.name.isdigit():
            continue
        root = paths.tpupod_root(int(worker.name))
        try:
            boot = json.loads((root / "bootstrap.json").read_text())
            job = parse_status((root / "status.json").read_text())
        except (OSError, ValueError):
            return False
        if not isinstance(boot, dict) or boot.get("state") != "ok" or job is None:
            return False
        if job.state not in (JobState.TRAINING, JobState.SAVING):
            return False
        if now - job.updated > FRESH_S:
            return False
    return True


class Reaper:
    """One daemon thread deleting the pod's trash, oldest entry first, while `quiet()`: each with
    an `rm -rf` of its own (a C loop, not this process's GIL, which serves the pod's APIs),
    stopped (SIGSTOP) whenever the pod is not quiet and continued (SIGCONT) when it is again."""

    def __init__(self, paths: PodPaths, quiet: Callable[[], bool] | None = None,
                 max_wait_s: float = MAX_WAIT_S, poll_s: float = POLL_S,
                 command: tuple[str, ...] = RM) -> None:  # fmt: skip
        # the old disks' trash, then the workers' lost memory's (localpod.vm.memory)
        self.trashes = (paths.root / "trash", memory.trash_dir(paths.root))
        self.quiet = quiet or (lambda: workers_quiet(paths))
        self.max_wait_s = max_wait_s
        self.poll_s = poll_s
        self.command = command
        self.spawned = 0  # rm processes started (tests count them)
        self._rm: subprocess.Popen | None = None
        self._rm_lock = threading.Lock()  # the zombie reaper must see an rm from its fork on
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trash-reaper", daemon=True)

    def start(self) -> Reaper:
        self._thread.start()
        return self

    def pids(self) -> set[int]:
        """The rm running now, if any: its Popen waits for it (the controller's zombie reaping
        leaves it alone)."""
        with self._rm_lock:
            return {self._rm.pid} if self._rm is not None else set()

    def stop(self) -> None:
        """End the thread and its rm at once, then hand what is left to one detached `rm` of the
        whole trash (renamed aside first): a controller's exit is never held by GBs of deletes,
        and the next pod on this directory starts with an empty trash."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for trash in self.trashes:
            if trash.is_dir():
                with contextlib.suppress(OSError):
                    trash.rename(trash.parent / f"trash-leaving-{time.time_ns()}")
        leaving = [str(p) for trash in self.trashes  # with an earlier rm's, cut short
                   for p in trash.parent.glob("trash-leaving-*")]  # fmt: skip
        if leaving:
            subprocess.Popen([*RM, *leaving], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip

    def _entries(self) -> list[Path]:
        """Memory's entries first (quick, and what the next boots need), each trash's oldest
        first."""
        found: list[Path] = []
        for trash in self.trashes:
            with contextlib.suppress(OSError):
                found += [p for p in trash.iterdir() if p.name != STUCK]
        return sorted(found, key=lambda p: (not self._memory(p), trashed_at(p)))

    def _memory(self, entry: Path) -> bool:
        return entry.parent == self.trashes[1]

    def _allowed(self, entry: Path, since: float) -> bool:
        if self.quiet() or time.time() - since > self.max_wait_s:
            return True
        if not self._memory(entry):
            return False
        try:
            return shutil.disk_usage(entry.parent).free < MEMORY_FLOOR_BYTES
        except OSError:  # the pod is going down: release() deletes it all
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                entries = self._entries()
                if entries and self._allowed(entries[0], since := trashed_at(entries[0])):
                    self._delete(entries[0], since)
                    continue
            except Exception as err:  # noqa: BLE001 - the reaper outlives any one bad turn
                print(f"trash reaper: {type(err).__name__}: {err}", file=sys.stderr)
            self._stop.wait(self.poll_s)

    def _delete(self, entry: Path, since: float) -> None:
        with self._rm_lock:
            self._rm = rm = subprocess.Popen(
                [*self.command, str(entry)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            self.spawned += 1
        running = True
        try:
            while rm.poll() is None and not self._stop.is_set():
                if self._allowed(entry, since) != running:
                    running = not running
                    rm.send_signal(signal.SIGCONT if running else signal.SIGSTOP)
                self._stop.wait(self.poll_s)
        finally:
            if rm.poll() is None:  # stopping: stop() hands the rest to one detached rm
                rm.kill()
                rm.send_signal(signal.SIGCONT)
                rm.wait()
            with self._rm_lock:
                self._rm = None
        if rm.returncode <= 0 or self._stop.is_set() or not os.path.lexists(entry):
            return  # done, or killed by a signal (the next turn takes it again)
        stuck = entry.parent / STUCK
        stuck.mkdir(exist_ok=True)
        entry.rename(stuck / entry.name)
        print(f"trash reaper: rm exited {rm.returncode} on {entry}: set aside in {stuck}",
              file=sys.stderr)  # fmt: skip
