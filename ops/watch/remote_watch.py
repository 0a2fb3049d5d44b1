"""The commands' side of a watcher whose state lives in the bucket (`ops.watch.remote_state`):
`tpupod watch` under the lease, the watcher lines of `tpupod status`, `tpupod logs --watcher`.

Wherever it runs (the stack's watcher VM, the local pod's watcher VM, a laptop) `watch` is the
same: journal and incident in `gs://BUCKET/ops/<stack>/`, one actor at a time by the lease, the
others observing. The local journal file stays too, for the goodput report.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from contract.layout import attempt_dir
from contract.metadata import RUN_DIR
from ops.cloud.slice import Provider, ProviderError
from ops.cloud.storage_errors import STORAGE_ERRORS
from ops.watch import EXIT_DONE, EXIT_GAVE_UP, WatchConfig, Watcher
from ops.watch.journal import Journal, echo
from ops.watch.lease import Lease, LeaseView, Observer, default_holder, run_leased
from ops.watch.remote_state import CALL_TIMEOUT, RemoteState, open_bucket

LEASE_TTL = {"local": 15.0, "gcp": 120.0}  # seconds; the holder renews every ttl/4


def remote_state(provider: Provider) -> RemoteState:
    state = RemoteState.for_target(provider.target)
    state.check()
    return state


def watch_with_lease(
    provider: Provider,
    config: WatchConfig,
    journal_file: Path,
    console: Console,
    *,
    holder: str | None = None,
    ttl: float | None = None,
    observe_only: bool = False,
) -> int:
    state = remote_state(provider)
    stack = provider.target.stack
    where = f"gs://{state.bucket.name}/{state.prefix}"
    console.print(f"watching stack {stack}; journal {journal_file} and {where}", style="dim")
    observer = Observer(state, console)
    if observe_only:
        return observe(state, observer, config.poll)
    lease = Lease(state, holder or default_holder(), ttl or LEASE_TTL.get(stack, LEASE_TTL["gcp"]))

    def act(guard) -> int:
        watcher = Watcher(
            provider, Journal(journal_file, console, sink=state.append), config, store=state,
            hold=state.read_hold,
        )  # fmt: skip
        watcher.guard = guard
        return watcher.run()

    return run_leased(lease, observer, act, max(config.poll, 1.0))


def observe(state: RemoteState, observer: Observer, poll: float) -> int:
    """Print the acting watcher's journal until it journals `done` or `gave_up` (its code)."""
    observer.start()
    lease = Lease(state, "observer", 0.0)
    while True:
        try:
            view = lease.read()
        except STORAGE_ERRORS:
            view = None
        before = observer.cursor
        observer.poll(view)
        if observer.cursor != before:
            last = state.read_journal(after="", last=1)
            if last and last[0][1].get("event") in ("done", "gave_up"):
                return EXIT_DONE if last[0][1]["event"] == "done" else EXIT_GAVE_UP
        time.sleep(max(poll, 1.0))


# -- status and logs ------------------------------------------------------------------------------
def watcher_lines(provider: Provider, last: int = 5) -> list[str]:
    """Heartbeat, lease holder and the last journal events, as `tpupod status` prints them."""
    try:
        state = RemoteState.for_target(provider.target)
        view = Lease(state, "status", 0.0).read()
        records = state.read_journal(last=last)
    except (ProviderError, *STORAGE_ERRORS) as err:
        return [f"watcher: bucket state unreadable ({' '.join(str(err).split())[:200]})"]
    lines = [describe_lease(view)]
    for _, record in records:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.get("time", 0)))
        lines.append(f"  {stamp} {record.get('event', ''):<12} {record.get('message', '')}")
    if not records:
        lines.append("  (no journal events yet)")
    return lines


def restart_lines(provider: Provider) -> list[str]:
    """Every restart of the run and why, from the journal: one line per attempt started."""
    try:
        state = RemoteState.for_target(provider.target)
        records = [r for _, r in state.read_journal()]
        hold = state.read_hold()
    except (ProviderError, *STORAGE_ERRORS):
        return []
    return restarts_of(records, hold)


def restarts_of(records: list[dict], hold: dict | None) -> list[str]:
    """restart_lines from the journal's records and the run's hold."""
    lines, cause, moved, beside = [], "?", "", {}
    for r in records:
        if r.get("event") == "recreated" and r.get("zone") in beside:  # that request won
            moved = beside[r["zone"]]
        if r.get("event") == "detected":
            cause, moved, beside = r.get("message", "?"), "", {}
        elif r.get("event") in ("stockout", "quota") and r.get("next_zone") != r.get("zone"):
            moved = f", after {r['event']} in {r.get('zone')}"  # why the slice changed zone
        elif r.get("event") == "beside":  # a request filed beside one still waiting
            beside[r.get("next_zone")] = f", after waiting in {r.get('zone')}"
        elif r.get("event") in ("restarted", "recreated") and r.get("attempt"):
            stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(r.get("time", 0)))
            how = "restart" if r["event"] == "restarted" else "recreated slice"
            if r.get("zone"):
                how += f" in {r['zone']}{moved}"
            lines.append(f"  attempt {r['attempt']} ({stamp}, {how}): {cause}")
        elif r.get("event") == "gave_up":
            lines.append(f"  recovery stopped: {r.get('message', '')}")
    if hold:
        lines.append(f"  held by {hold.get('by', '?')} ({hold.get('reason', '')}): `tpupod start`")
    return ["restarts:", *lines] if lines else []


def attempt_logs(provider: Provider, attempt: int, worker: int | None) -> list[tuple[str, str]]:
    """(gs:// URI, text) of attempt `attempt`'s job output, per worker, from the run directory."""
    run_dir = provider.target.metadata.get(RUN_DIR)
    if not run_dir:
        raise ProviderError(f"node spec of {provider.target.stack} names no run directory")
    bucket = open_bucket(provider.target)
    prefix = attempt_dir(run_dir.removeprefix(f"gs://{bucket.name}/"), attempt) + "/"
    try:
        blobs = sorted(bucket.list_blobs(prefix=prefix, timeout=CALL_TIMEOUT), key=lambda b: b.name)
        found = [(f"gs://{bucket.name}/{b.name}", b.download_as_bytes(timeout=CALL_TIMEOUT))
                 for b in blobs if worker is None or b.name.endswith(f"/worker-{worker}.log")]  # fmt: skip
    except STORAGE_ERRORS as err:
        raise ProviderError(f"reading gs://{bucket.name}/{prefix}: {err}") from None
    if not found:
        raise ProviderError(f"no output of attempt {attempt} in gs://{bucket.name}/{prefix}")
    return [(uri, data.decode(errors="replace")) for uri, data in found]


def describe_lease(view: LeaseView | None) -> str:
    if view is None:
        return "watcher: none has run (no lease in the bucket)"
    now = time.time()
    beat = f"heartbeat {now - view.renewed:.0f}s ago"
    if view.live(now):
        return (
            f"watcher: {view.holder} holds the lease ({beat}, expires in {view.expires - now:.0f}s)"
        )
    return f"watcher: none acting; last holder {view.holder} ({beat}, lease expired)"


def follow_journal(provider: Provider, lines: int, follow: bool, console: Console) -> int:
    """`tpupod logs --watcher`: the last `lines` events from the bucket, then new ones."""
    try:
        state = RemoteState.for_target(provider.target)
        state.check()
    except ProviderError:
        raise
    cursor = ""
    for name, record in state.read_journal(last=lines):
        cursor = name
        echo(console, record)
    while follow:
        time.sleep(1.0)
        try:
            records = state.read_journal(after=cursor)
        except STORAGE_ERRORS:
            continue
        for name, record in records:
            cursor = name
            echo(console, record)
    return 0
