"""`tpupod local ...`: up, down, status, endpoints, secret, and the faults (preempt, crash, hang,
storage-faults, package-index; the TPU API's stockout and answer are localpod.cli_tpu).

Errors are `PodError`s: ops.cli prints any type in `USER_ERRORS` as one line (exit 2), so this
module depends on no ops module. `slice_table` draws a slice from its attributes alone (state,
health, detail, workers[].index/host/port/user/key_filename), for any caller's slice type.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from contract import job as jobs
from infra import builtin_job
from infra.cleanup import CleanupError
from infra.config_checks import CREATE_VIAS
from localpod import cli_tpu
from localpod.gcp import iam_policy, tpu_client
from localpod.gcp.iam_policy import COMPUTE_STACK, DEFAULT_STACK
from localpod.pod import LocalPod
from localpod.state import PodError, SliceState

USER_ERRORS = (PodError, jobs.JobError)

_STATE_STYLE = {
    "READY": "green",
    "CREATING": "yellow",
    "DELETING": "yellow",
    "PREEMPTED": "red",
    "TERMINATED": "red",
}


def slice_table(info, title: str = "slice") -> Table:
    """Slice state and health in the title, one row per worker endpoint."""
    style = _STATE_STYLE.get(str(info.state), "white")
    health = f", {info.health}" if info.health else ""
    detail = f" ({info.detail})" if info.detail else ""
    table = Table(title=f"{title}: [{style}]{info.state}[/{style}]{health}{detail}")
    for column in ("worker", "host", "ssh port", "user", "key"):
        table.add_column(column)
    for w in info.workers:
        table.add_row(str(w.index), w.host, str(w.port), w.user or "", w.key_filename or "")
    return table


def _pod(args: argparse.Namespace, **kwargs) -> LocalPod:
    return LocalPod(getattr(args, "pod_dir", None), **kwargs)


def job_of(args: argparse.Namespace) -> jobs.Job:
    """`--job DIR`, else the built-in trainer's job for `--preset` and `--steps`."""
    if args.job is not None:
        if args.preset is not None or args.steps is not None:
            raise PodError("--preset and --steps shape the built-in trainer's job; not with --job")
        return jobs.load(args.job)
    preset, steps = args.preset or "tiny", args.steps or 200
    if preset not in (presets := builtin_job.preset_steps()):
        raise PodError(f"--preset {preset!r}: unknown; use one of {', '.join(presets)}")
    if steps < 1:
        raise PodError("--steps must be at least 1")
    return builtin_job.builtin(f"--config {preset} --steps {steps}")


def _rollout(args: argparse.Namespace) -> int:
    from localpod.rollout import publish

    given = args.job is not None or args.preset is not None or args.steps is not None
    result = publish(_pod(args), job_of(args) if given else None)
    if not result["changed"]:
        print(f"bundle {result['new'][:12]} is the node's already: nothing to roll out")
        return 0
    print(f"node metadata now names bundle {result['new'][:12]} (was {(result['old'] or '?')[:12]});"
          " a watcher rolls it out to the workers at a checkpoint boundary")  # fmt: skip
    return 0


def _up(args: argparse.Namespace) -> int:
    if args.workers < 1 or args.workers > 250:
        raise PodError("--workers must be between 1 and 250")
    for flag, chips in (
        ("--quota-chips", args.quota_chips),
        ("--zone-quota-chips", args.zone_quota_chips),
    ):
        if chips is not None and chips < 0:
            raise PodError(f"{flag} {chips}: a quota of 0 chips or more")
    if args.api == "compute" and args.create_via == "queued":
        raise PodError("--api compute --create-via queued: queued resources exist only on the "
                       "Cloud TPU API; a group through Compute Engine is created directly")  # fmt: skip
    script = args.startup_script
    if script is not None and not script.is_file():
        raise PodError(f"--startup-script {script}: no such file")
    job = job_of(args)
    pod = _pod(
        args,
        workers=args.workers,
        devices_per_worker=args.devices_per_worker,
        startup_script=script,
        job=job,
        run_id=args.run_id,
        create_via=args.create_via or ("direct" if args.api == "compute" else "queued"),
        spot=not args.on_demand,
        queue_first=True,
        quota_chips=args.quota_chips,
        zone_quota_chips=args.zone_quota_chips,
        iam_stack=args.stack or iam_policy.stack_for(args.api),
        api=args.api,
    )
    console = Console()
    started = time.monotonic()
    with console.status("starting the local pod") as status:
        info = pod.up(progress=lambda message: status.update(message))
    console.print(slice_table(info, title=f"local pod ({pod.paths.root})"))
    console.print(f"job: {job.source}; run {pod.run_id} (gs://{pod.bucket}/{pod.run_prefix})")
    console.print(
        f"up in {time.monotonic() - started:.1f} s; workers are booting (startup-script)."
    )
    if args.watcher:  # one more local VM running `tpupod watch` (bootstrap/watcher-startup.sh)
        from localpod.vm import watcher_vm

        watcher_vm.start(pod.paths.root)
        console.print("watcher VM started: `tpupod status` / `tpupod logs --watcher` follow it")
    console.print(
        f"boot logs: {pod.paths.root}/workers/<i>/startup-script.log; next: tpupod status, "
        "tpupod local endpoints, tpupod local preempt|crash|hang, tpupod local down"
    )
    return 0


def _down(args: argparse.Namespace) -> int:
    """As `pulumi destroy --run-program`: the stack's nodes and requests through the TPU API
    (what was deleted), then every process of the pod (even when that API refused)."""
    pod = _pod(args)
    if pod.is_up():
        try:
            for line in pod.delete_owned().lines():
                print(line)
        except (PodError, CleanupError) as err:
            print(f"tpupod: {err}; stopping the pod anyway", file=sys.stderr)
    if not pod.down():
        raise PodError(f"no local pod is up in {pod.paths.root}")
    print(f"local pod in {pod.paths.root} is down")
    return 0


def _status(args: argparse.Namespace) -> int:
    """The node as the TPU API tells it, and how to reach each worker."""
    endpoints = _pod(args).endpoints()
    parent = f"projects/{endpoints['project']}/locations/{endpoints['zone']}"
    tpu = tpu_client.client(endpoints)
    nodes = list(tpu.list_nodes(parent=parent))
    console = Console()
    if not nodes:
        console.print(f"no node in {parent} ({endpoints['tpu_api']})")
        return 0
    node = nodes[0]
    names = [
        next((i.value for i in g.query_value.items if i.key == "hostname"), "")
        for g in tpu.get_guest_attributes(request={"name": node.name}).guest_attributes
    ]
    # A value the client cannot name (an answer injected: `tpupod local answer`) is a bare int.
    state, health = (getattr(v, "name", str(v)) for v in (node.state, node.health))
    table = Table(title=f"{node.name}: {state}, {health} {node.health_description}".strip())
    for column in ("worker", "instance", "ip", "ssh port"):
        table.add_column(column)
    ports = endpoints["ssh"]["ports"]
    for index, endpoint in enumerate(node.network_endpoints):
        name = names[index] if index < len(names) else ""
        address = endpoint.ip_address
        table.add_row(str(index), name, address, str(ports.get(address, "")))
    console.print(table)
    return 0


def _endpoints(args: argparse.Namespace) -> int:
    found = _pod(args).endpoints()
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    table = Table(title="the local pod's cloud", show_header=False)
    ssh = found["ssh"]
    for key in ("tpu_api", "compute_api", "project", "zone", "region", "node", "mig",
                "workload_policy", "storage", "bucket", "spec_file"):  # fmt: skip
        if key in found:
            table.add_row(key, str(found[key]))
    for key in ("user", "key_file", "known_hosts", "iap_command"):
        table.add_row(f"ssh {key}", ssh[key])
    for address, port in ssh["ports"].items():
        table.add_row(f"ssh {address}", str(port))
    for name, identity in found.get("identities", {}).items():
        table.add_row(f"identity {name}", f"{identity['email']} (token: {identity['token_file']})")
    Console().print(table)
    return 0


def _call(args: argparse.Namespace, action) -> int:
    result = action(_pod(args))
    if result is not None:
        Console().print(result)
    return 0


def _maintenance(args: argparse.Namespace) -> int:
    if args.seconds < 0:
        raise PodError("--seconds must be >= 0")

    def maintain(pod: LocalPod) -> str:
        info = pod.maintenance(args.seconds)
        if info.state is SliceState.PREEMPTED:
            return "slice PREEMPTED: host maintenance ends a spot node"
        return f"slice {info.state}, {info.health} after {args.seconds:g} s of host maintenance"

    return _call(args, maintain)


def _preempt(args: argparse.Namespace) -> int:
    if args.notice < 0:
        raise PodError("--notice must be >= 0")

    def preempt(pod: LocalPod) -> str:
        info = pod.preempt(notice=args.notice, wait=not args.no_wait)
        return f"slice {info.state} (notice {args.notice:g} s)"

    return _call(args, preempt)


def _crash(args: argparse.Namespace) -> int:
    if not getattr(args, "when", None):
        return _call(args, lambda pod: f"worker {args.worker}: job {pod.crash(args.worker)} killed")
    if args.delay < 0:
        raise PodError("--delay must be >= 0")

    def arm(pod: LocalPod) -> str:  # the kill waits for the job to say that state
        pod.kill_when(args.worker, args.when, args.delay)
        return f"worker {args.worker}: armed: its next job is killed {args.delay:g} s after saying {args.when!r}"

    return _call(args, arm)


def _hang(args: argparse.Namespace) -> int:
    return _call(args, lambda pod: f"worker {args.worker}: job {pod.hang(args.worker)} stopped")


def _secret(args: argparse.Namespace) -> int:
    """A secret's value in the pod's Secret Manager (as `gcloud secrets versions add`)."""
    if not jobs.SECRET_ID.match(args.name):
        raise PodError(f"{args.name!r} is not a Secret Manager secret id")
    data = args.data_file.read_bytes() if args.data_file else sys.stdin.buffer.read()
    _pod(args).set_secret(args.name, data)
    print(f"secret {args.name}: {len(data)} bytes; jobs read it at their next start")
    return 0


def _package_index(args: argparse.Namespace) -> int:
    """Cut the workers off PyPI and GitHub (or give them back), from their next boot on."""
    pod = _pod(args)
    if args.state is not None:
        pod.package_index(reachable=args.state == "reachable")
    state = "unreachable" if pod.paths.registry_unreachable.exists() else "reachable"
    print(f"package indexes: {state} for workers booted from now on (the bucket stays reachable)")
    return 0


def _storage_faults(args: argparse.Namespace) -> int:
    """Show the bucket's fault plan and counts; with --rate, replace the plan first."""
    plan = None
    if args.rate is not None and not 0 <= args.rate <= 1:
        raise PodError(f"--rate {args.rate:g}: a fraction of requests, from 0 to 1")
    if args.rate is not None:
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        plan = {"rate": args.rate, "kinds": kinds, "stall_s": args.stall_s, "seed": args.seed}
    report = _pod(args).storage_faults(plan)
    p = report["plan"]
    injected = ", ".join(f"{k} {n}" for k, n in report["injected"].items())
    print(f"storage faults: {p['rate']:.1%} of requests fail as {'/'.join(p['kinds'])} "
          f"(stall {p['stall_s']:g} s, seed {p['seed']}); {report['requests']} requests "
          f"since the plan was set, injected: {injected}")  # fmt: skip
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    pod_dir = argparse.ArgumentParser(add_help=False)
    pod_dir.add_argument("--pod-dir", type=Path, help=argparse.SUPPRESS)

    local = subparsers.add_parser(
        "local", help="the local pod: a TPU slice simulated on this machine"
    )
    sub = local.add_subparsers(dest="local_command", metavar="ACTION", required=True)

    up = sub.add_parser("up", parents=[pod_dir], help="start the pod; returns once it is READY")
    up.add_argument("--workers", type=int, default=2, help="workers (hosts) in the slice")
    up.add_argument(
        "--job", type=Path,
        help="the job directory (with tpupod-job.yaml) every worker runs, anywhere on disk",
    )  # fmt: skip
    up.add_argument(
        "--run-id", help="continue run ID (its checkpoints) instead of starting a new run"
    )
    up.add_argument("--preset", help="the built-in trainer's config preset [tiny]")
    up.add_argument("--steps", type=int, help="the built-in trainer's training steps [200]")
    up.add_argument("--devices-per-worker", type=int, default=2, help="CPU devices per worker")
    up.add_argument(
        "--stack",
        help="the stack whose IAM the pod's cloud enforces: its service accounts, grants and "
        f"enabled APIs, as `pulumi up` would leave them [{DEFAULT_STACK}; {COMPUTE_STACK} with "
        "--api compute, whose watcher's role is Compute Engine's]",
    )  # fmt: skip
    up.add_argument("--startup-script", type=Path, help=argparse.SUPPRESS)
    up.add_argument(
        "--watcher", action="store_true", help="also start the watcher VM (recovers the slice)"
    )
    up.add_argument(
        "--on-demand", action="store_true",
        help="an on-demand node (default spot): host maintenance reboots it, not ends it",
    )  # fmt: skip
    up.add_argument(
        "--api", choices=("tpu", "compute"), default="tpu",
        help="which API makes the slice: a node through the Cloud TPU API, or a managed "
        "instance group with a workload policy through Compute Engine (a TPU7x slice, as "
        "tpupod:api) [tpu]",
    )  # fmt: skip
    up.add_argument(
        "--create-via", choices=CREATE_VIAS,
        help="how the slice is created (here, and by recovery, as tpupod:createVia): a queued "
        "resource (Google's recommendation) or nodes.create [queued; direct with --api compute]",
    )  # fmt: skip
    up.add_argument("--quota-chips", type=int, metavar="N",
                    help="the TPU API's chip quota in the pod's region, spot and on-demand each "
                    "[no limit]")  # fmt: skip
    up.add_argument("--zone-quota-chips", type=int, metavar="N",
                    help="the same per zone [no limit]")  # fmt: skip
    up.set_defaults(func=_up)

    rollout = sub.add_parser(
        "rollout", parents=[pod_dir],
        help="what `pulumi up` does after a code change: upload this tree's bundle and patch the "
        "node's metadata; a watcher rolls it out to the workers at a checkpoint boundary",
    )  # fmt: skip
    rollout.add_argument("--job", type=Path, help="the job directory [the job running]")
    rollout.add_argument("--preset", help="the built-in trainer's preset [the job running]")
    rollout.add_argument("--steps", type=int, help="the built-in trainer's steps [the job running]")
    rollout.set_defaults(func=_rollout)

    sub.add_parser(
        "down", parents=[pod_dir],
        help="delete the stack's nodes and queued resources in every zone (as `pulumi destroy "
        "--run-program`), then stop everything the pod started",
    ).set_defaults(func=_down)  # fmt: skip
    sub.add_parser(
        "status", parents=[pod_dir], help="the node as the pod's TPU API tells it"
    ).set_defaults(func=_status)
    endpoints = sub.add_parser(
        "endpoints", parents=[pod_dir], help="what a client needs: TPU API, storage, SSH"
    )
    endpoints.add_argument("--json", action="store_true", help="print endpoints.json")
    endpoints.set_defaults(func=_endpoints)

    preempt = sub.add_parser("preempt", parents=[pod_dir], help="preempt the slice like GCE")
    preempt.add_argument(
        "--notice", type=float, default=0.0,
        help="seconds from SIGTERM to SIGKILL [0: none, as GCP may give none]",
    )  # fmt: skip
    preempt.add_argument("--no-wait", action="store_true", help="return before PREEMPTED")
    preempt.set_defaults(func=_preempt)
    maintenance = sub.add_parser(
        "maintenance", parents=[pod_dir],
        help="GCE host maintenance: an on-demand node reboots (its job starts at boot), a spot "
        "node is preempted",
    )  # fmt: skip
    maintenance.add_argument("--seconds", type=float, default=5.0, help="how long it lasts [5]")
    maintenance.set_defaults(func=_maintenance)

    for name, func, what in (("crash", _crash, "SIGKILL"), ("hang", _hang, "SIGSTOP")):
        parser = sub.add_parser(
            name, parents=[pod_dir], help=f"{what} the job's process group on a worker"
        )
        parser.add_argument("--worker", type=int, required=True, help="worker index")
        if name == "crash":
            parser.add_argument(
                "--when", metavar="STATE",
                help="not now: once a new job process's status file says STATE (e.g. "
                "restoring, with a crash first: the restart's restore is killed)")  # fmt: skip
            parser.add_argument("--delay", type=float, default=0.3,
                                help="seconds after STATE is first seen [0.3]")  # fmt: skip
        parser.set_defaults(func=func)

    secret = sub.add_parser(
        "secret", parents=[pod_dir],
        help="set a secret (value from stdin) in the pod's Secret Manager, before or after up",
    )  # fmt: skip
    secret.add_argument("name", help="the secret id, as a job's `secrets:` names it")
    secret.add_argument("--data-file", type=Path, help="read the value from this file")
    secret.set_defaults(func=_secret)

    index = sub.add_parser(
        "package-index", parents=[pod_dir],
        help="cut workers booted from now on off PyPI and GitHub (a VPC without NAT), or not; "
        "without a state, show it",
    )  # fmt: skip
    index.add_argument("state", nargs="?", choices=("reachable", "unreachable"))
    index.set_defaults(func=_package_index)

    cli_tpu.register(sub, pod_dir)

    faults = sub.add_parser(
        "storage-faults", parents=[pod_dir],
        help="fail a fraction of the bucket's requests (429, 503, dropped, stalled), as GCS can; "
        "without --rate, show the plan and what it injected",
    )  # fmt: skip
    faults.add_argument(
        "--rate", type=float, help="fraction of requests that fail, 0 to 1 (0: off)"
    )
    faults.add_argument(
        "--kinds",
        default="429,503,drop",
        help="comma-separated: 429, 503, drop, stall [%(default)s]",
    )
    faults.add_argument(
        "--stall-s", type=float, default=5.0, help="how long a stalled request waits [%(default)s]"
    )
    faults.add_argument("--seed", type=int, default=0, help="seed of the fault draws [0]")
    faults.set_defaults(func=_storage_faults)
