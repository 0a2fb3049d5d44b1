"""`tpupod job check DIR`: validate a job directory the way a stack or a pod would use it,
starting nothing. A bad key is one line naming the key and the file, exit 2."""

from __future__ import annotations

import argparse

from rich.console import Console

from contract.job import JobError, load
from infra.bundle_archive import build_bundle


def cmd_check(args: argparse.Namespace) -> int:
    job = load(args.dir)
    spec = job.spec
    bundle = build_bundle(job=job)
    console = Console()
    console.print(f"job {job.source}: ok", style="green")
    progress = spec.progress_regex and f"regex {spec.progress_regex!r}" or spec.progress
    rows = [
        ("run", spec.run),
        ("python", spec.python),
        ("files", f"{len(job.files)} ({job.size / 1024:.0f} KiB; bundle {bundle.sha256[:12]})"),
        ("steps", str(spec.steps or "not declared")),
        ("progress", progress),
        (
            "exit codes",
            f"preempted {list(spec.exit_codes.preempted)}, fatal "
            f"{list(spec.exit_codes.fatal)}, 0 done (docs: README)",
        ),  # fmt: skip
        ("restarts", f"max {spec.max_restarts}, backoff {spec.backoff_s:g}s"),
        ("grace", f"{spec.grace_s}s from SIGTERM to SIGKILL"),
        ("env", ", ".join(spec.env) or "-"),
        ("secrets", ", ".join(f"{k} <- {v}" for k, v in spec.secrets.items()) or "-"),
    ]
    for key, value in rows:
        console.print(f"  {key:<11} {value}", markup=False, highlight=False)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    job = subparsers.add_parser("job", help="the job contract: check a job directory")
    sub = job.add_subparsers(dest="job_command", metavar="ACTION", required=True)
    check = sub.add_parser(
        "check", help="validate DIR/tpupod-job.yaml and what it names; starts nothing"
    )
    check.add_argument("dir", help="the job directory")
    check.set_defaults(func=cmd_check)


USER_ERRORS = (JobError,)
