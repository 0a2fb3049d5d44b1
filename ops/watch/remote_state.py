"""`watch`'s state in the stack's bucket, under `ops/<stack>/`: it outlives the machine watching.

- `journal/<time-µs>-<seq>.json`: one object per event (GCS objects cannot be appended to; names
  sort by time, so a listing is the journal in order and a reader follows it by the last name seen).
- `incident.json`: the open incident and the budgets (`ops.watch.incident.WatchState`), rewritten at
  every change, so a watcher that restarts (systemd, a VM replaced, a laptop taking over)
  continues the incident where the last one stopped instead of creating the node twice.
- `lease.json`: who acts now (`ops.watch.lease`).
- `hold.json`: the run is stopped on purpose (`tpupod stop`, until `tpupod start`): `watch` acts
  on nothing while it exists.
- `incidents/<N>/worker-<i>.txt`: hang forensics (`ops.fleet.forensics`), so `tpupod logs --incident N`
  reads on a laptop what the watcher VM captured.

The bucket is the one named in the node spec's metadata (`tpupod-bucket`). On GCP the client uses
Application Default Credentials (the watcher VM's own service account, which may write this prefix
only); on the local pod it talks to the pod's GCS emulator with the same credentials rule
(ops.cloud.credentials). One code path for both: no local-file fallback.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from dataclasses import asdict
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import storage

from ops.cloud.credentials import credentials
from ops.cloud.slice import ProviderError
from ops.cloud.storage_errors import STORAGE_ERRORS
from ops.cloud.target import Target
from ops.watch.incident import WatchState, state_from_dict

NO_BUCKET_METADATA = "DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA"
BUCKET_KEY = "tpupod-bucket"  # contract.metadata.BUCKET: the spec's metadata names the bucket
CALL_TIMEOUT = 20.0
PROGRESS_SAVE_S = 30.0  # one GCS write per poll would cost more than the watcher VM


def ops_prefix(stack: str) -> str:
    return f"ops/{stack}/"


def bucket_name(target: Target) -> str:
    name = target.metadata.get(BUCKET_KEY)
    if not name:
        raise ProviderError(
            f"node spec of {target.stack} names no bucket (metadata `{BUCKET_KEY}`); "
            "redeploy the stack so its node_spec output carries it"
        )
    return name


def open_bucket(target: Target) -> storage.Bucket:
    """The stack's bucket through google-cloud-storage (the emulator's on the local pod)."""
    endpoint = getattr(target, "storage_endpoint", None)
    options = {"api_endpoint": endpoint} if endpoint else None
    # google-cloud-storage otherwise fetches the bucket's metadata in the background for its
    # telemetry: storage.buckets.get, which the watcher's grants (objects under its prefix)
    # rightly lack, so every start would leave a denied call in the project's audit log.
    os.environ.setdefault(NO_BUCKET_METADATA, "true")
    creds = credentials(getattr(target, "token_file", None))
    client = storage.Client(project=target.project, credentials=creds, client_options=options)
    return client.bucket(bucket_name(target))


class RemoteState:
    """The journal and the incident of one stack in its bucket."""

    def __init__(self, bucket: storage.Bucket, stack: str):
        self.bucket, self.stack = bucket, stack
        self.prefix = ops_prefix(stack)
        self._seq = itertools.count()
        self._pending: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._saved: dict | None = None  # what incident.json holds now (as this process wrote it)
        self._saved_at = 0.0
        self._last_hold: dict | None = None
        self._incidents: set[int] | None = None  # listed once, then kept up by put_forensics

    @classmethod
    def for_target(cls, target: Target) -> RemoteState:
        return cls(open_bucket(target), target.stack)

    def blob(self, name: str) -> storage.Blob:
        return self.bucket.blob(self.prefix + name)

    def check(self) -> None:
        """One list call: fail early, in one line, when the bucket is not reachable or allowed."""
        try:
            list(self.bucket.list_blobs(prefix=self.prefix, max_results=1, timeout=CALL_TIMEOUT))
        except STORAGE_ERRORS as err:
            raise ProviderError(
                f"bucket gs://{self.bucket.name}/{self.prefix} unreachable: {_line(err)} "
                "(the watcher needs storage access to that prefix)"
            ) from None

    # -- journal -------------------------------------------------------------------------------
    def append(self, record: dict[str, Any]) -> None:
        """A Journal sink: one object per event; kept and retried when the bucket is away."""
        name = f"journal/{int(record['time'] * 1e6):017d}-{next(self._seq):06d}.json"
        data = json.dumps(record, sort_keys=True, default=str).encode()
        with self._lock:
            self._pending.append((name, data))
            while self._pending:
                name, data = self._pending[0]
                try:
                    self.blob(name).upload_from_string(
                        data, content_type="application/json", timeout=CALL_TIMEOUT
                    )
                except STORAGE_ERRORS:
                    return  # the next event tries again; the local journal has it meanwhile
                self._pending.pop(0)

    def journal_names(self, after: str = "") -> list[str]:
        blobs = self.bucket.list_blobs(prefix=self.prefix + "journal/", timeout=CALL_TIMEOUT)
        return sorted(b.name for b in blobs if b.name > after)

    def read_journal(self, after: str = "", last: int | None = None) -> list[tuple[str, dict]]:
        """(object name, record) oldest first, names after `after`; only the `last` N if given."""
        names = self.journal_names(after)
        if last is not None:
            names = names[-last:] if last > 0 else []
        records = []
        for name in names:
            try:
                records.append((name, json.loads(self.bucket.blob(name).download_as_bytes())))
            except (gexc.NotFound, ValueError):
                continue
        return records

    # -- incident: the IncidentStore interface ---------------------------------------------------
    def load(self) -> WatchState | None:
        try:
            raw = json.loads(self.blob("incident.json").download_as_bytes(timeout=CALL_TIMEOUT))
        except gexc.NotFound:
            return None
        except ValueError:
            return None
        except STORAGE_ERRORS as err:
            raise ProviderError(f"reading {self.prefix}incident.json: {_line(err)}") from None
        return state_from_dict(raw)

    def save(self, state: WatchState) -> None:
        """At once when the incident or a budget changed; a new `last_step` alone at most every
        PROGRESS_SAVE_S (watch saves at every change: each poll while training, else)."""
        snapshot = asdict(state)
        progress_only = self._saved is not None and {
            k: v for k, v in snapshot.items() if k != "last_step"
        } == {k: v for k, v in self._saved.items() if k != "last_step"}
        if progress_only and time.time() - self._saved_at < PROGRESS_SAVE_S:
            return
        data = json.dumps(snapshot, sort_keys=True, default=str)
        try:
            self.blob("incident.json").upload_from_string(
                data, content_type="application/json", timeout=CALL_TIMEOUT
            )
        except STORAGE_ERRORS as err:
            raise ProviderError(f"writing {self.prefix}incident.json: {_line(err)}") from None
        self._saved, self._saved_at = snapshot, time.time()

    def clear(self) -> None:
        self._saved = None
        with contextlib.suppress(gexc.NotFound):
            self.blob("incident.json").delete(timeout=CALL_TIMEOUT)

    # -- hold: `tpupod stop` / `tpupod start` ------------------------------------------------------
    def read_hold(self) -> dict | None:
        """The hold `tpupod stop` wrote, None when the run is not held (or unreadable now)."""
        try:
            raw = self.blob("hold.json").download_as_bytes(timeout=CALL_TIMEOUT)
            self._last_hold = json.loads(raw) if raw else None
        except (gexc.NotFound, ValueError):
            self._last_hold = None
        except STORAGE_ERRORS:
            pass  # unreachable now: the last answer stands
        return self._last_hold

    def write_hold(self, hold: dict) -> None:
        self.blob("hold.json").upload_from_string(
            json.dumps(hold, sort_keys=True), content_type="application/json", timeout=CALL_TIMEOUT
        )

    def clear_hold(self) -> bool:
        """True when there was a hold."""
        try:
            self.blob("hold.json").delete(timeout=CALL_TIMEOUT)
        except gexc.NotFound:
            return False
        return True

    # -- hang forensics ------------------------------------------------------------------------
    def forensics_numbers(self) -> set[int]:
        """The incidents with forensics in the bucket: listed once per process (a laptop that
        takes over from the watcher VM goes on from the VM's numbers), then kept up by this
        process's own puts, so a hang's restart does not wait on a listing that grows with
        every incident."""
        if self._incidents is None:
            blobs = self.bucket.list_blobs(prefix=self.prefix + "incidents/", timeout=CALL_TIMEOUT)
            found = (b.name[len(self.prefix + "incidents/") :].split("/", 1)[0] for b in blobs)
            self._incidents = {int(n) for n in found if n.isdigit()}
        return set(self._incidents)

    def put_forensics(self, number: int, name: str, text: str) -> str:
        """One worker's file of incident `number`; returns its gs:// URI."""
        blob = self.blob(f"incidents/{number}/{name}")
        blob.upload_from_string(text, content_type="text/plain", timeout=CALL_TIMEOUT)
        if self._incidents is not None:
            self._incidents.add(number)
        return f"gs://{self.bucket.name}/{blob.name}"

    def forensics(self, number: int) -> list[tuple[str, str]]:
        """(gs:// URI, text) of every file of incident `number`, in listing order."""
        prefix = f"{self.prefix}incidents/{number}/"
        blobs = self.bucket.list_blobs(prefix=prefix, timeout=CALL_TIMEOUT)
        return [
            (
                f"gs://{self.bucket.name}/{b.name}",
                b.download_as_bytes(timeout=CALL_TIMEOUT).decode(),
            )
            for b in blobs
        ]


def _line(err: BaseException) -> str:
    text = getattr(err, "message", None) or str(err) or type(err).__name__
    return " ".join(str(text).split())[:300]
