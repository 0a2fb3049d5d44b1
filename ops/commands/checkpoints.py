"""`tpupod checkpoints --stack S [--verify]`: a run's checkpoint steps as the bucket holds them.

For each committed step: its commit time, size, object count, format (OCDBT or the plain one
before it), whether its files are the ones its manifest lists (sizes and CRC32Cs,
trainer/manifest.py: the check a restore makes first), and whether it reads back: its metadata
decodes, its three items (state, data, meta) are there, and every stored value of `state` reads
in full through tensorstore, the library Orbax restores with (`--structure-only` skips that last
read). `--verify` exits 1 when a committed step fails either check. Then the step a restart would resume
from (the newest readable one, as the trainer's fallback picks it) and the steps a fallback set
aside (`<step>.unreadable-<UTC time>`).

Where the run lives: `--stack local` reads the pod's endpoints.json (its GCS emulator and bucket)
and node spec (the run's directory, `gs://<bucket>/runs/local/<run id>`); any other stack needs
`--workdir gs://BUCKET/PREFIX` (the stack's `run_dir` output) and Application Default
Credentials.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from contract import checkpoint_manifest as manifest
from contract.layout import checkpoint_dir
from ops.cli import CliError
from ops.commands.checkpoint_run import Run, locate

STEP = re.compile(r"^\d+$")
ASIDE = manifest.ASIDE
ITEMS = ("state", "data", "meta")


@dataclass
class StepReport:
    name: str
    step: int
    committed: bool
    time: str | None = None  # UTC, ISO 8601
    size: int = 0
    objects: int = 0
    format: str = "?"
    readable: bool | None = None
    problem: str = ""
    set_aside: bool = False
    verified: bool | None = None  # None: no manifest (a run from before manifests)


def list_objects(run: Run) -> dict[str, list]:
    """Blobs under the run's checkpoint directory (contract.layout), by their first path component (the step dir)."""
    base = checkpoint_dir(run.prefix) + "/"
    try:
        blobs = list(run.client.list_blobs(run.bucket, prefix=base))
    except Exception as err:  # noqa: BLE001 - connection, 404 bucket, 403: all one line
        raise CliError(f"cannot list {checkpoint_dir(run.workdir)}: "
                       f"{str(err).splitlines()[0][:200]}") from None  # fmt: skip
    by_dir: dict[str, list] = {}
    for blob in blobs:
        rel = blob.name[len(base) :]
        if "/" in rel:
            by_dir.setdefault(rel.split("/", 1)[0], []).append((rel.split("/", 1)[1], blob))
    return by_dir


def _gcs_spec(run: Run, name: str, item: str) -> dict:
    path = "/".join(p for p in (checkpoint_dir(run.prefix), name, item) if p) + "/"
    return {"driver": "gcs", "bucket": run.bucket, "path": path}


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text[:200]


def check_state(run: Run, name: str, files: dict, read_values: bool) -> str:
    """'' when every stored value of `state` reads in full, else what failed."""
    import tensorstore as ts

    base = _gcs_spec(run, name, "state")
    spec = {"driver": "ocdbt", "base": base} if "state/manifest.ocdbt" in files else base
    try:
        kv = ts.KvStore.open(spec).result()
        keys = kv.list().result()
        if not keys:
            return "state/: no stored values"
        if read_values:
            for key, pending in [(k, kv.read(k)) for k in keys]:
                if pending.result().state != "value":
                    return f"state/: {key.decode()} is missing"
    except Exception as err:  # noqa: BLE001 - tensorstore reports every storage error as one
        return f"state/: {_first_line(err)}"
    return ""


def inspect_step(run: Run, name: str, entries: list, read_values: bool) -> StepReport:
    files = {rel: blob for rel, blob in entries}
    aside = ASIDE.match(name)
    report = StepReport(
        name=name,
        step=int(aside.group(1) if aside else name),
        committed=manifest.COMMIT_SUCCESS in files,
        size=sum(int(b.size or 0) for b in files.values()),
        objects=len(files),
        format="ocdbt" if "state/manifest.ocdbt" in files else "plain",
        set_aside=bool(aside),
    )
    try:
        meta = json.loads(files["_CHECKPOINT_METADATA"].download_as_bytes())
        stamp = meta.get("commit_timestamp_nsecs") or meta.get("init_timestamp_nsecs")
        report.time = datetime.datetime.fromtimestamp(stamp / 1e9, datetime.UTC).isoformat(
            timespec="seconds"
        )
    except KeyError:
        report.problem = "_CHECKPOINT_METADATA: missing"
    except Exception as err:  # noqa: BLE001 - undecodable metadata is what we report
        report.problem = f"_CHECKPOINT_METADATA: {_first_line(err)}"
    if not report.committed or aside:
        return report
    if problem := verify(files):
        report.verified, report.readable, report.problem = False, False, problem
        return report
    report.verified = True if manifest.NAME in files else None
    missing = [item for item in ITEMS if not any(r.startswith(f"{item}/") for r in files)]
    if report.problem or missing:
        report.readable = False
        report.problem = report.problem or ", ".join(f"{m}/: missing" for m in missing)
        return report
    for rel, blob in files.items():
        if rel.startswith(("meta/", "data/")) and rel.endswith((".json", "metadata")):
            try:
                json.loads(blob.download_as_bytes())
            except Exception as err:  # noqa: BLE001
                report.readable, report.problem = False, f"{rel}: {_first_line(err)}"
                return report
    report.problem = check_state(run, name, files, read_values)
    report.readable = not report.problem
    return report


def verify(files: dict) -> str:
    """'' when the step's blobs are what its manifest lists (or it has none), else why not."""
    if manifest.NAME not in files:
        return ""
    try:
        doc = json.loads(files[manifest.NAME].download_as_bytes())
    except Exception as err:  # noqa: BLE001 - unreadable or not JSON: not verified
        return f"{manifest.NAME}: verification failed: {_first_line(err)}"
    listed = {rel: [int(b.size or 0), b.crc32c] for rel, b in files.items() if rel != manifest.NAME}
    problem = manifest.differences(doc if isinstance(doc, dict) else {}, listed)
    if problem is None:
        return ""
    file, _, why = problem.partition(": ")
    return f"{file}: verification failed: {why}"


def survey(run: Run, read_values: bool = True) -> list[StepReport]:
    """Every step directory (committed, in progress, set aside), oldest first."""
    dirs = list_objects(run)
    names = [n for n in dirs if STEP.match(n) or ASIDE.match(n)]
    reports = [inspect_step(run, n, dirs[n], read_values) for n in names]
    return sorted(reports, key=lambda r: (r.step, r.set_aside, r.name))


def resume_step(reports: list[StepReport]) -> int | None:
    """The newest step a restart restores: committed, readable and verified (a run that has
    manifests restores no step without one, trainer/manifest.py)."""
    manifests = any(r.verified is not None for r in reports if r.committed and not r.set_aside)
    usable = [r.step for r in reports if r.committed and not r.set_aside and r.readable
              and (r.verified or not manifests)]  # fmt: skip
    return max(usable, default=None)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _status(r: StepReport) -> str:
    if r.set_aside:
        return "[yellow]set aside[/]"
    if not r.committed:
        return "[dim]not committed[/]"
    if r.verified is False:
        return "[red]NOT VERIFIED[/]"
    good = "verified, readable" if r.verified else "readable (no manifest)"
    return f"[green]{good}[/]" if r.readable else "[red]UNREADABLE[/]"


def cmd_checkpoints(args: argparse.Namespace) -> int:
    run = locate(args)
    reports = survey(run, read_values=not args.structure_only)
    resume = resume_step(reports)
    bad = [r for r in reports if r.committed and not r.set_aside and not r.readable]
    code = 1 if args.verify and bad else 0
    if args.json:
        print(json.dumps({"workdir": run.workdir, "resume_step": resume,
                          "steps": [asdict(r) for r in reports]}))  # fmt: skip
        return code
    console = Console()
    table = Table(title=f"checkpoints in {checkpoint_dir(run.workdir)}")
    for column in ("step", "committed (UTC)", "size", "objects", "format", "state"):
        table.add_column(column, justify="right" if column in ("step", "size", "objects") else None)
    for r in reports:
        step = f"{r.step} (resume)" if r.step == resume and not r.set_aside else str(r.step)
        table.add_row(step, r.time or "-", _size(r.size), str(r.objects), r.format, _status(r))
    console.print(table)
    for r in reports:
        if r.set_aside:
            console.print(f"step {r.step} set aside by a fallback: {r.name}", highlight=False)
        elif r.committed and not r.readable:
            what = "not verified" if r.verified is False else "unreadable"
            console.print(f"step {r.step} {what}: {r.problem}", highlight=False, markup=False)
    committed = [r for r in reports if r.committed and not r.set_aside]
    if resume is not None:
        console.print(f"a restart resumes from step {resume}")
    elif committed:
        console.print("a restart fails: no committed step is readable (the trainer exits 2 and "
                      "moves nothing); use a new --workdir or repair a step")  # fmt: skip
    else:
        console.print("a restart starts from step 0: no committed step yet")
    if args.verify:
        good = [r.step for r in committed if r.readable and r.verified]
        console.print(f"verified and readable: {', '.join(map(str, good)) or 'none'}; "
                      f"failing: {', '.join(str(r.step) for r in bad) or 'none'}")  # fmt: skip
    return code


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "checkpoints",
        help="a run's checkpoint steps: time, size, readable or not, where a restart resumes",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument("--stack", required=True, help="`local` or a Pulumi stack name")
    p.add_argument(
        "--pod-dir", type=Path, help="the local pod's directory [$TPUPOD_POD_DIR, .tpupod]"
    )
    p.add_argument(
        "--workdir",
        help="the run's directory, gs://BUCKET/PREFIX [local: the pod's run, "
        "gs://<pod bucket>/runs/local/<run id>]",
    )
    p.add_argument(
        "--structure-only",
        action="store_true",
        help="check metadata and files only, without reading every stored value",
    )
    p.add_argument(
        "--verify", action="store_true",
        help="name the good steps and exit 1 when a committed step fails verification or a read",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.set_defaults(func=cmd_checkpoints)
