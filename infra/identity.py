"""WorkerIdentity: the service account the TPU workers run as, with the least it needs.

On the bucket, its metadata (storage.buckets.get: Orbax reads it) and, by object prefix (IAM
conditions on `resource.name`, which need uniform bucket-level access): this stack's checkpoints `runs/<stack>/` and compile cache
`compile-cache/<stack>/` read-write, code bundles `bundles/` read-only (and prepared data `data/`
read-only when the stack trains on data there). So a compromised worker
can neither rewrite the code every recreated slice boots nor feed another stack's slices a
poisoned compiled program. No storage role on the project. Log and metric writing on the project.
Secret Manager: `secretAccessor` on each secret the job names (`secrets:` in tpupod-job.yaml),
granted on that secret only (the secrets themselves are the user's: created outside the stack,
their values never in config, bundle or metadata). No primitive role, never the default
compute SA. Why: docs/seams.md, "Bucket access".
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.component import child_options
from infra.grants import bucket_prefix_role, project_roles

PROJECT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")
READ_WRITE = "roles/storage.objectUser"  # get, list, create, overwrite, delete objects
READ_ONLY = "roles/storage.objectViewer"  # get, list objects
SECRET_READER = "roles/secretmanager.secretAccessor"  # access a secret's versions, nothing else
# The bucket's own metadata (storage.buckets.get; its storage.buckets.list is a project permission,
# void on a bucket): Orbax reads it before it lists or deletes steps (gcs_utils.get_bucket, to
# learn whether the bucket has a hierarchical namespace), so without it every trainer's first
# checkpoint listing is a 403 on GCP. No object access: the prefix grants below give that.
BUCKET_METADATA = "roles/storage.bucketViewer"


@dataclass(frozen=True)
class PrefixGrant:
    """One bucket role, limited to one object prefix."""

    name: str
    role: str
    prefix: str  # `{stack}` is filled in
    why: str


BUCKET_GRANTS = (
    PrefixGrant("runs", READ_WRITE, "runs/{stack}/", "checkpoints and status of this stack"),
    PrefixGrant(
        "compile-cache", READ_WRITE, "compile-cache/{stack}/", "XLA cache, this stack's only"
    ),
    PrefixGrant("bundles", READ_ONLY, "bundles/", "code bundles: read, never written by workers"),
    PrefixGrant(
        "envs",
        READ_WRITE,
        "envs/{stack}/",
        "worker environments (bootstrap/envcache.py): worker 0 publishes, every boot installs",
    ),  # fmt: skip
)
# Only for a stack whose `tpupod:data` lies in its own bucket (data in another bucket: README,
# "Your data", says what to grant there).
DATA_GRANT = PrefixGrant("data", READ_ONLY, "data/", "prepared training data: read-only")


@dataclass(frozen=True)
class WorkerIdentityArgs:
    account_id: str
    project: str
    bucket: pulumi.Input[str]
    stack: str
    display_name: str = "tpupod TPU workers"
    read_data: bool = False  # grant DATA_GRANT: the stack's data is under its bucket's data/
    secrets: tuple[str, ...] = ()  # Secret Manager secret ids the job reads at start


class WorkerIdentity(pulumi.ComponentResource):
    email: pulumi.Output[str]

    def __init__(
        self, name: str, args: WorkerIdentityArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("tpupod:infra:WorkerIdentity", name, None, opts)
        child = child_options(self, opts)
        account = gcp.serviceaccount.Account(
            f"{name}-sa",
            account_id=args.account_id,
            project=args.project,
            display_name=args.display_name,
            description="Runs the tpupod trainer on TPU workers",
            opts=child,
        )
        member = account.email.apply(lambda email: f"serviceAccount:{email}")
        for grant in BUCKET_GRANTS + ((DATA_GRANT,) if args.read_data else ()):
            prefix = grant.prefix.format(stack=args.stack)
            bucket_prefix_role(f"{name}-bucket-{grant.name}", args.bucket, grant.role, member,
                               prefix, f"tpupod {grant.name}", f"{prefix}: {grant.why}",
                               child)  # fmt: skip
        gcp.storage.BucketIAMMember(f"{name}-bucket-metadata", bucket=args.bucket,
                                    role=BUCKET_METADATA, member=member, opts=child)  # fmt: skip
        for secret in args.secrets:
            gcp.secretmanager.SecretIamMember(
                f"{name}-secret-{secret}",
                project=args.project,
                secret_id=secret,
                role=SECRET_READER,
                member=member,
                opts=child,
            )
        project_roles(name, args.project, member, PROJECT_ROLES, child)
        self.email = account.email
        self.register_outputs({"email": self.email})
