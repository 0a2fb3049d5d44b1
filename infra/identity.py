"""WorkerIdentity: the service account the TPU workers run as, with the least it needs.

Object admin on the checkpoint bucket only (read bundles, write checkpoints and the compile
cache), and log/metric writing on the project. No primitive role, never the default compute SA.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

BUCKET_ROLE = "roles/storage.objectAdmin"
PROJECT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")


@dataclass(frozen=True)
class WorkerIdentityArgs:
    account_id: str
    project: str
    bucket: pulumi.Input[str]
    display_name: str = "tpupod TPU workers"


class WorkerIdentity(pulumi.ComponentResource):
    email: pulumi.Output[str]

    def __init__(
        self, name: str, args: WorkerIdentityArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("tpupod:infra:WorkerIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        account = gcp.serviceaccount.Account(
            f"{name}-sa",
            account_id=args.account_id,
            project=args.project,
            display_name=args.display_name,
            description="Runs the tpupod trainer on TPU workers",
            opts=child,
        )
        member = account.email.apply(lambda email: f"serviceAccount:{email}")
        gcp.storage.BucketIAMMember(
            f"{name}-bucket-object-admin",
            bucket=args.bucket,
            role=BUCKET_ROLE,
            member=member,
            opts=child,
        )
        for role in PROJECT_ROLES:
            gcp.projects.IAMMember(
                f"{name}-{role.split('/')[-1]}",
                project=args.project,
                role=role,
                member=member,
                opts=child,
            )
        self.email = account.email
        self.register_outputs({"email": self.email})
