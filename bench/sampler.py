"""Samples a local pod's worker files from the pod directory while a run goes on.

Recovery phases need timestamps that survive re-creation (every create wipes the workers' disks),
so a thread copies what matters as it appears: each change of a trainer's status file (its own
`heartbeat` is the write time), every bootstrap.json (its phases carry start/end times), and the
new lines of worker 0's job.log stamped with the time they were first seen (the trainer's JSON
lines carry no time of their own: resolution is the poll interval).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

STATUS_FILES = {
    "status.json": "job",
    "reference-status.json": "reference",  # the same job, same checkpoint policy, no faults
    "reference-none-status.json": "reference-none",  # ... and no checkpoints
}
STATUS_FIELDS = ("pid", "state", "step", "restored_from", "restored_tier", "compile_cache_hit",
                 "exit_code", "last_checkpoint", "local_save_s")  # fmt: skip


def worker_root(pod_dir: Path, index: int) -> Path:
    """$TPUPOD_ROOT of local-pod worker `index` (localpod.state.PodPaths.tpupod_root)."""
    return Path(pod_dir) / "workers" / str(index) / "tpupod"


def _read_json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class _Tail:
    """New complete lines of a file that may be replaced (new inode) or truncated."""

    def __init__(self, path: Path):
        self.path, self.inode, self.offset, self.partial = path, None, 0, b""

    def read(self) -> list[str]:
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        if st.st_ino != self.inode or st.st_size < self.offset:
            self.inode, self.offset, self.partial = st.st_ino, 0, b""
        if st.st_size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in lines]


class Sampler(threading.Thread):
    """Polls every `interval` s until stop(); results in `status`, `boots` and `lines`."""

    def __init__(self, pod_dir: Path, workers: int, interval: float = 0.2):
        super().__init__(name="bench-sampler", daemon=True)
        self.pod_dir, self.workers, self.interval = Path(pod_dir), workers, interval
        self.status: list[dict] = []  # one entry per change: t, worker, source, STATUS_FIELDS...
        self.boots: dict[tuple[int, float], dict] = {}  # (worker, started) -> last bootstrap.json
        self.lines: list[dict] = []  # worker 0's job.log: {"t", "text" or "json"}
        self._last: dict[tuple[int, str], tuple] = {}
        self._tail = _Tail(worker_root(self.pod_dir, 0) / "job.log")
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.poll()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        self.poll()  # the last word: done/exit states written just before stopping

    def poll(self) -> None:
        now = time.time()
        for index in range(self.workers):
            root = worker_root(self.pod_dir, index)
            for name, source in STATUS_FILES.items():
                doc = _read_json(root / name)
                if doc is None:
                    continue
                key = tuple(doc.get(f) for f in STATUS_FIELDS)
                if self._last.get((index, source)) != key:
                    self._last[(index, source)] = key
                    fields = {f: doc.get(f) for f in STATUS_FIELDS}
                    self.status.append(
                        {
                            "t": now,
                            "worker": index,
                            "source": source,
                            "heartbeat": doc.get("heartbeat"),
                            # when it was written: the trainer's heartbeat, a job's `time`
                            "updated": doc.get("heartbeat") or doc.get("time"),
                            **fields,
                        }
                    )
            boot = _read_json(root / "bootstrap.json")
            if boot and boot.get("started"):
                self.boots[(index, boot["started"])] = boot
        for text in self._tail.read():
            if text.startswith("jobrun:"):
                self.lines.append({"t": now, "text": text})
            elif text.startswith("{"):
                try:
                    doc = json.loads(text)
                except ValueError:
                    continue
                if "event" not in doc:  # a metrics line: keep what the analyses use
                    doc = {k: doc.get(k) for k in ("step", "step_time")}
                self.lines.append({"t": now, "json": doc})

    def record(self) -> dict:
        """Everything sampled, JSON-able (for bench/out and the analyses)."""
        return {
            "status": list(self.status),
            "boots": [{"worker": w, **doc} for (w, _), doc in sorted(self.boots.items())],
            "lines": list(self.lines),
        }
