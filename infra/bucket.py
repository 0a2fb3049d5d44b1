"""CheckpointBucket: where checkpoints, the compile cache and code bundles live.

It outlives the slice: `protect=True` unless the stack opts out, never `force_destroy`, uniform
access, public access prevention enforced. Soft delete keeps every deleted or overwritten object
restorable for `soft_delete_days` (7 by default, `tpupod:softDeleteDays`): a soft-deleted object
"cannot be permanently deleted" before then, whereas a noncurrent version under object versioning
can be, by anyone holding storage.objects.delete (see docs/seams.md, Bucket access). Temporary
objects that a killed writer leaves behind expire on their own so a preempted run leaks nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from infra.component import child_options
from infra.security import SOFT_DELETE_DAYS_DEFAULT, UNPROTECTED_LABEL

TEMP_OBJECT_SUFFIXES = [".tmp"]  # trainer.storage writes `<name>.<pid>.tmp` then renames
TEMP_OBJECT_MAX_AGE_DAYS = 3
SECONDS_PER_DAY = 24 * 60 * 60


@dataclass(frozen=True)
class CheckpointBucketArgs:
    name: str
    location: str
    labels: dict[str, str] = field(default_factory=dict)
    protect: bool = True
    existing: bool = False  # use the bucket named `name` as it is
    soft_delete_days: int = SOFT_DELETE_DAYS_DEFAULT


class CheckpointBucket(pulumi.ComponentResource):
    name: pulumi.Output[str]
    url: pulumi.Output[str]

    def __init__(
        self, name: str, args: CheckpointBucketArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("tpupod:infra:CheckpointBucket", name, None, opts)
        if args.existing:
            self.name = pulumi.Output.from_input(args.name)
        else:
            labels = dict(args.labels)
            if not args.protect:
                labels[UNPROTECTED_LABEL[0]] = UNPROTECTED_LABEL[1]
            bucket = gcp.storage.Bucket(
                f"{name}-bucket",
                name=args.name,
                location=args.location.upper(),
                storage_class="STANDARD",
                uniform_bucket_level_access=True,
                public_access_prevention="enforced",
                force_destroy=False,
                labels=labels,
                lifecycle_rules=_temporary_object_rules(),
                soft_delete_policy=gcp.storage.BucketSoftDeletePolicyArgs(
                    retention_duration_seconds=args.soft_delete_days * SECONDS_PER_DAY
                ),
                opts=child_options(self, opts, protect=args.protect),
            )
            self.name = bucket.name
        self.url = self.name.apply(lambda n: f"gs://{n}")
        self.register_outputs({"name": self.name, "url": self.url})


def _temporary_object_rules() -> list[gcp.storage.BucketLifecycleRuleArgs]:
    """Delete abandoned `*.tmp` objects and abort multipart uploads a preempted writer left."""
    return [
        gcp.storage.BucketLifecycleRuleArgs(
            action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                age=TEMP_OBJECT_MAX_AGE_DAYS, matches_suffixes=TEMP_OBJECT_SUFFIXES
            ),
        ),
        gcp.storage.BucketLifecycleRuleArgs(
            action=gcp.storage.BucketLifecycleRuleActionArgs(type="AbortIncompleteMultipartUpload"),
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=1),
        ),
    ]
