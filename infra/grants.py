"""The stack's repeated resource shapes, defined once: a member's project roles, a bucket role
limited to one object prefix, and an SSH ingress rule to the workers (the worker identity, the
watcher and the network each declare some; names stay as each component gives them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pulumi
import pulumi_gcp as gcp


def prefix_condition(bucket: str, prefix: str) -> str:
    """CEL: objects under `prefix` (and the bare `prefix` name itself, which gcsfs probes), plus
    listing the bucket with a list prefix of the same shape (`storage.objects.list` is checked on
    the bucket, with the request's prefix as an API attribute)."""
    folder = prefix.rstrip("/")
    objects = f"projects/_/buckets/{bucket}/objects/{folder}"
    listed = 'api.getAttribute("storage.googleapis.com/objectListPrefix", "")'
    return (
        f'resource.name == "{objects}" || resource.name.startsWith("{objects}/") || '
        f'(resource.type == "storage.googleapis.com/Bucket" && '
        f'({listed} == "{folder}" || {listed}.startsWith("{folder}/")))'
    )


def project_roles(
    name: str, project: pulumi.Input[str], member: pulumi.Input[str], roles: Iterable[str],
    opts: pulumi.ResourceOptions,
) -> None:  # fmt: skip
    """One IAMMember per role, named `<name>-<role id>`."""
    for role in roles:
        gcp.projects.IAMMember(f"{name}-{role.split('/')[-1]}", project=project, role=role,
                               member=member, opts=opts)  # fmt: skip


def bucket_prefix_role(
    resource: str, bucket: pulumi.Input[str], role: str, member: pulumi.Input[str], prefix: str,
    title: str, description: str, opts: pulumi.ResourceOptions,
) -> None:  # fmt: skip
    """`role` on the bucket, for objects under `prefix` only (an IAM condition)."""
    gcp.storage.BucketIAMMember(
        resource,
        bucket=bucket,
        role=role,
        member=member,
        condition=gcp.storage.BucketIAMMemberConditionArgs(
            title=title,
            description=description,
            expression=pulumi.Output.from_input(bucket).apply(
                lambda b: prefix_condition(b, prefix)
            ),
        ),
        opts=opts,
    )


def ssh_ingress(
    resource: str, gce_name: str, network: pulumi.Input[str], description: str, worker_tag: str,
    opts: pulumi.ResourceOptions, source_ranges: Sequence[str] | None = None,
    source_tags: Sequence[str] | None = None,
) -> None:  # fmt: skip
    """TCP 22 into the workers (`worker_tag`) from the ranges or tags given, nothing else."""
    gcp.compute.Firewall(
        resource,
        name=gce_name,
        network=network,
        direction="INGRESS",
        description=description,
        source_ranges=list(source_ranges) if source_ranges else None,
        source_tags=list(source_tags) if source_tags else None,
        target_tags=[worker_tag],
        allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
        opts=opts,
    )
