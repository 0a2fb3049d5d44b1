"""The local cloud's IAM policy, as a stack declares it.

`tpupod local up --stack S` evaluates stack S's Pulumi program (infra.offline, under mocks) as the
pod's own stack (`local`: the pod's project, bucket and job) and keeps what IAM would hold after
`pulumi up`: the service accounts, every binding (project, bucket, service account, secret; with
its IAM Condition), the custom roles and the enabled services. The operator is the project's
owner. Nothing is granted that the stack does not grant: a role missing from the stack is a 403 in
the local cloud as on GCP.

The evaluation takes seconds (the program builds the code bundle), so it runs in a subprocess
(`python -m localpod.gcp.iam_policy`) and its result is cached by the hash of everything it reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from localpod.state import PROJECT_ROOT, PodError

DEFAULT_STACK = "v4-32"  # the stack whose IAM the pod enforces unless `--stack` names another
COMPUTE_STACK = "tpu7x-16"  # the same with `--api compute` (a stack through Compute Engine)


def stack_for(api: str) -> str:
    """The stack whose IAM a pod of this slice API enforces by default (its watcher's role is
    that API's)."""
    return COMPUTE_STACK if api == "compute" else DEFAULT_STACK


OPERATOR = "user:operator@example.com"  # the person at the terminal: the project's owner
OWNER = "roles/owner"
CACHE_ENV = "TPUPOD_CACHE_DIR"
# The program's IAM resource types -> how each names the resource its binding is on.
BINDING_TYPES = {
    "gcp:projects/iAMMember:IAMMember": lambda i: f"projects/{i['project']}",
    "gcp:storage/bucketIAMMember:BucketIAMMember": lambda i: f"projects/_/buckets/{i['bucket']}",
    "gcp:serviceaccount/iAMMember:IAMMember": lambda i: i["serviceAccountId"],
    "gcp:secretmanager/secretIamMember:SecretIamMember": (
        lambda i: f"projects/{i['project']}/secrets/{i['secretId']}"
    ),
}
ACCOUNT = "gcp:serviceaccount/account:Account"
BUCKET = "gcp:storage/bucket:Bucket"
# A new bucket's own policy (uniform bucket-level access): the project's basic roles reach its
# objects through these convenience members, not through roles/owner itself, which grants no
# object access (Cloud Storage: "IAM roles", basic roles and convenience values).
BUCKET_DEFAULTS = (
    ("roles/storage.legacyBucketOwner", "projectOwner"),
    ("roles/storage.legacyBucketOwner", "projectEditor"),
    ("roles/storage.legacyBucketReader", "projectViewer"),
    ("roles/storage.legacyObjectOwner", "projectOwner"),
    ("roles/storage.legacyObjectOwner", "projectEditor"),
    ("roles/storage.legacyObjectReader", "projectViewer"),
)
CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
SERVICE = "gcp:projects/service:Service"
WATCHER_ACCOUNT_SUFFIX = "-watch"  # infra: the watcher's account id ends so (__main__.py)


@dataclass(frozen=True)
class Binding:
    resource: str  # projects/P, projects/_/buckets/B, projects/P/serviceAccounts/E, ...
    role: str
    member: str  # serviceAccount:EMAIL or user:EMAIL
    condition: str | None = None  # a CEL expression (IAM Conditions)


@dataclass(frozen=True)
class Policy:
    stack: str  # the stack file it was evaluated from
    project: str
    services: tuple[str, ...]
    custom_roles: dict[str, list[str]]  # projects/P/roles/ID -> permissions
    bindings: tuple[Binding, ...]
    accounts: dict[str, str] = field(default_factory=dict)  # "workers" / "watcher" -> email

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> Policy:
        return cls(
            stack=raw["stack"],
            project=raw["project"],
            services=tuple(raw["services"]),
            custom_roles={k: list(v) for k, v in raw["custom_roles"].items()},
            bindings=tuple(Binding(**b) for b in raw["bindings"]),
            accounts=dict(raw.get("accounts") or {}),
        )

    def members(self) -> set[str]:
        return {b.member for b in self.bindings}


def from_resources(stack: str, project: str, resources: list) -> Policy:
    """The policy a deployed stack leaves, from its registered resources (infra.offline)."""
    bindings, custom, services, accounts = [], {}, set(), {}
    for r in resources:
        inputs = r.inputs
        if r.type in BINDING_TYPES:
            condition = (inputs.get("condition") or {}).get("expression")
            bindings.append(Binding(BINDING_TYPES[r.type](inputs), inputs["role"],
                                    inputs["member"], condition))  # fmt: skip
        elif "iam" in r.type.lower() and r.type not in (CUSTOM_ROLE,):
            raise PodError(f"stack {stack}: IAM resource type {r.type} is not understood by "
                           "the local cloud (localpod/gcp/iam_policy.py BINDING_TYPES)")  # fmt: skip
        elif r.type == CUSTOM_ROLE:
            custom[f"projects/{inputs['project']}/roles/{inputs['roleId']}"] = list(
                inputs["permissions"]
            )
        elif r.type == SERVICE:
            services.add(inputs["service"])
        elif r.type == BUCKET:
            bindings += [Binding(f"projects/_/buckets/{inputs['name']}", role,
                                 f"{convenience}:{project}") for role, convenience in
                         BUCKET_DEFAULTS]  # fmt: skip
        elif r.type == ACCOUNT:
            email = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
            role = "watcher" if inputs["accountId"].endswith(WATCHER_ACCOUNT_SUFFIX) else "workers"
            accounts[role] = email
    bindings.append(Binding(f"projects/{project}", OWNER, OPERATOR))
    return Policy(stack, project, tuple(sorted(services)), custom, tuple(bindings), accounts)


def stack_config(stack: str, project: str, bucket: str, job_dir: str | None) -> dict[str, str]:
    """Stack `stack`'s config as the pod's own stack: its project and bucket, and its job."""
    from infra import offline

    if stack not in offline.stack_names():
        raise PodError(f"--stack {stack!r}: no stacks/Pulumi.{stack}.yaml (stacks: "
                       f"{', '.join(offline.stack_names())})")  # fmt: skip
    config = offline.stack_config(stack, project=None)
    config.update({"gcp:project": project, "tpupod:bucketName": bucket})
    for key in ("tpupod:existingBucket", "tpupod:data"):
        config.pop(key, None)  # the pod's own bucket, and no data of the stack's
    if job_dir is not None:
        for key in ("tpupod:preset", "tpupod:steps", "tpupod:trainerArgs"):
            config.pop(key, None)
        config["tpupod:job"] = job_dir
    return config


def evaluate(stack: str, pod_stack: str, project: str, bucket: str, job_dir: str | None) -> Policy:
    """In this process: the stack's program under mocks (slow: run it through `load`)."""
    from infra import offline

    config = stack_config(stack, project, bucket, job_dir)
    evaluation = offline.evaluate(pod_stack, config, check=False)
    if evaluation.error is not None:
        raise PodError(f"stack {stack} does not evaluate: {evaluation.error}")
    return from_resources(stack, project, evaluation.resources)


def _cache_key(*parts: str) -> str:
    digest = hashlib.sha256("\0".join(parts).encode())
    sources = [PROJECT_ROOT / "__main__.py", PROJECT_ROOT / "contract" / "iam_catalog.json",
               Path(__file__), *sorted((PROJECT_ROOT / "infra").glob("*.py")),
               PROJECT_ROOT / "stacks" / f"Pulumi.{parts[0]}.yaml"]  # fmt: skip
    for path in sources:
        digest.update(path.read_bytes() if path.is_file() else b"-")
    return digest.hexdigest()[:32]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or PROJECT_ROOT / ".tpupod" / "cache") / "iam"


def secrets_job(secrets: tuple[str, ...]) -> str | None:
    """A job directory that reads `secrets` and does nothing else (None without secrets): what a
    job contributes to a stack's IAM is its secrets alone (a grant on each, and Secret Manager
    on), so the policy is evaluated with this stand-in and cached by the secrets, not the job."""
    if not secrets:
        return None
    directory = cache_dir() / "jobs" / hashlib.sha256("\0".join(secrets).encode()).hexdigest()[:16]
    spec = directory / "tpupod-job.yaml"
    if not spec.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        listed = "".join(f"  - {s}\n" for s in secrets)
        spec.write_text(f"run: 'true'\nprogress: none\nsecrets:\n{listed}")
    return str(directory)


def load(stack: str, pod_stack: str, project: str, bucket: str,
         secrets: tuple[str, ...] = ()) -> Policy:  # fmt: skip
    """The policy, from the cache or a fresh evaluation in a subprocess (PodError on failure)."""
    job_dir = secrets_job(secrets)
    key = _cache_key(stack, pod_stack, project, bucket, ",".join(secrets))
    cached = cache_dir() / f"{key}.json"
    if cached.is_file():
        return Policy.from_json(json.loads(cached.read_text()))
    args = [sys.executable, "-m", "localpod.gcp.iam_policy", stack, pod_stack, project, bucket]
    proc = subprocess.run([*args, *([job_dir] if job_dir else [])], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout or "no output").strip().splitlines()
        raise PodError(lines[-1] if lines else f"evaluating stack {stack} failed")
    raw = json.loads(proc.stdout)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(raw, indent=1, sort_keys=True))
    os.replace(tmp, cached)
    return Policy.from_json(raw)


def main(argv: list[str]) -> int:
    stack, pod_stack, project, bucket, *job = argv
    try:
        policy = evaluate(stack, pod_stack, project, bucket, job[0] if job else None)
    except PodError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(policy.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
