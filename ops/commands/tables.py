"""The operator's tables (rich): a slice as the provider describes it, and its workers as the
probes over SSH find them. Shared by `tpupod status` and anything else that draws a slice."""

from __future__ import annotations

from rich.table import Table

from ops.cloud.slice import SliceInfo, SliceState
from ops.fleet.probe import Probe

STATE_STYLE = {
    SliceState.READY: "green",
    SliceState.CREATING: "yellow",
    SliceState.DELETING: "yellow",
    SliceState.PREEMPTED: "red",
    SliceState.TERMINATED: "red",
}


def run_line(target, probes: list[Probe]) -> str:
    """The run as the workers tell it: id, attempt, step of steps."""
    job = target.job()
    run_id = target.metadata.get("tpupod-run-id", "?")
    attempts = {p.attempt for p in probes if p.attempt is not None}
    steps = [p.status.step for p in probes if p.status is not None]
    of = f" of {job.steps}" if job and job.steps else ""
    step = f"step {max(steps)}{of}" if steps else f"no progress reported yet{of and f' ({of[1:]})'}"
    attempt = "/".join(str(a) for a in sorted(attempts)) or "?"
    return f"run {run_id}, attempt {attempt}: {step}"


def worker_table(info: SliceInfo, probes: list[Probe]) -> Table:
    """Per worker: bootstrap phase, job state and last exit code, step, loss, tokens/s,
    checkpoint, heartbeat."""
    table = Table(
        title=f"workers: slice {info.state}" + (f", {info.health}" if info.health else "")
    )
    for column in ("worker", "bootstrap", "job", "step", "loss", "tok/s", "ckpt", "beat"):
        table.add_column(column, justify="left" if column in ("bootstrap", "job") else "right")
    for p in probes:
        if not p.reachable:
            table.add_row(str(p.index), "[red]unreachable[/red]", p.error or "", *[""] * 5)
            continue
        boot = p.bootstrap or {}
        s = p.status
        job = ("running" if p.alive else "-") if s is None else str(s.state)
        if p.exit_code is not None and not p.alive:
            job += f" (exit {p.exit_code})"
        elif p.last_exit is not None:
            job += f" (last exit {p.last_exit})"
        state = boot.get("state", "-")
        table.add_row(
            str(p.index),
            state if state == "ok" else f"{state} ({boot.get('phase', '-')})",
            job,
            "-" if s is None else str(s.step),
            "-" if s is None or s.loss is None else f"{s.loss:.4f}",
            "-" if s is None or s.tokens_per_s is None else f"{s.tokens_per_s:,.0f}",
            "-" if s is None or s.last_checkpoint is None else str(s.last_checkpoint),
            "-" if p.heartbeat_age is None else f"{p.heartbeat_age:.1f}s ago",
        )
    return table


def owned_table(owned: list, zones: list[str], stack: str) -> Table:
    """What the stack owns in the TPU API (infra.cleanup.Owned), one row each."""
    where = ", ".join(zones)
    table = Table(title=f"stack {stack} owns {len(owned)} TPU resource(s) in {where}")
    for column in ("kind", "zone", "name", "state", "run"):
        table.add_column(column)
    for item in owned:
        table.add_row(item.kind, item.zone, item.id, item.state, item.run or "-")
    return table


def slice_table(info: SliceInfo, title: str = "slice") -> Table:
    """Slice state and health in the title, one row per worker as ops reaches it."""
    style = STATE_STYLE.get(info.state, "white")
    health = f", {info.health}" if info.health else ""
    detail = f" ({info.detail})" if info.detail and info.detail != info.state else ""
    where = f" in {info.zone}" if info.zone else ""
    table = Table(title=f"{title}: [{style}]{info.state}[/{style}]{where}{health}{detail}")
    for column in ("worker", "instance", "internal ip", "ssh to", "user"):
        table.add_column(column)
    for w in info.workers:
        via = f"{w.host}:{w.port}" + (" (IAP)" if w.proxy_command else "")
        table.add_row(str(w.index), w.instance or "", w.internal_ip or "", via, w.user or "")
    return table
