"""CodeBundle: the exact bytes every worker runs, uploaded under their content hash.

`infra.bundle_archive.build_bundle()` is the same function the local pod uses. The object name is
the hash, so a code change is a new object (and new metadata), never an overwrite.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from contract.job import Job
from infra.bundle_archive import PROJECT_ROOT, Bundle, build_bundle
from infra.component import child_options

# Where the archive waits for the engine to upload it (the Pulumi engine reads a FileAsset later).
CACHE_DIR = PROJECT_ROOT / ".tpupod" / "bundles"


@dataclass(frozen=True)
class CodeBundleArgs:
    bucket: pulumi.Input[str]
    job: Job  # its directory ships in the bundle (job/)
    root: Path = PROJECT_ROOT


class CodeBundle(pulumi.ComponentResource):
    bundle: Bundle
    object_name: str
    uri: pulumi.Output[str]

    def __init__(self, name: str, args: CodeBundleArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpupod:infra:CodeBundle", name, None, opts)
        self.bundle = build_bundle(args.root, args.job)
        self.object_name = self.bundle.object_name
        obj = gcp.storage.BucketObject(
            f"{name}-object",
            bucket=args.bucket,
            name=self.object_name,
            source=pulumi.FileAsset(str(_cached_file(self.bundle))),
            content_type="application/gzip",
            metadata={"tpupod-bundle-sha256": self.bundle.sha256},
            opts=child_options(self, opts),
        )
        self.uri = pulumi.Output.concat("gs://", obj.bucket, "/", obj.name)
        self.register_outputs({"uri": self.uri, "sha256": self.bundle.sha256})


def _cached_file(bundle: Bundle) -> Path:
    path = CACHE_DIR / f"{bundle.sha256}.tar.gz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_bytes(bundle.data)
        partial.replace(path)
    return path
