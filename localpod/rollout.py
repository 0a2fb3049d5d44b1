"""`tpupod local rollout`: what `pulumi up` does to a running slice when the code changed. The new
bundle goes to the bucket, the node's metadata is patched in place (nodes.patch, through the
pod's TPU API) and node-spec.json follows; the workers keep running until a watcher (or
`tpupod rollout`) rolls the bundle out at a checkpoint boundary."""

from __future__ import annotations

import json
from pathlib import Path

from contract import job as jobs
from contract import metadata
from infra import builtin_job
from infra.bundle_archive import PROJECT_ROOT, build_bundle
from localpod.gcp import storage, tpu_client
from localpod.gcp.identities import operator_token
from localpod.pod import LocalPod
from localpod.state import PodError, SliceState, read_json, write_json


def running_job(pod: LocalPod) -> jobs.Job:
    """The job the node runs, when it is the built-in trainer's (rebuilt from its spec); a job
    from a directory must be named again (`--job DIR`), since its files are not kept here."""
    spec = read_json(pod.paths.node_spec)
    if spec is None:
        raise PodError(f"no node spec {pod.paths.node_spec}: run `tpupod local up`")
    raw = spec["node"].get("metadata", {}).get(metadata.JOB)
    args = builtin_job.builtin_args((json.loads(raw) if raw else {}).get("run", ""))
    if args is None:
        raise PodError("this pod runs a job from a directory: pass it again with --job DIR")
    return builtin_job.builtin(args)


def publish(pod: LocalPod, job: jobs.Job | None = None, root: Path = PROJECT_ROOT) -> dict:
    """Build and upload the bundle of `root` (this tree) and `job` (default: the job running), patch the
    node's metadata with it and write node-spec.json. Returns {"old", "new", "changed"}."""
    spec = read_json(pod.paths.node_spec)
    if spec is None:
        raise PodError(f"no node spec {pod.paths.node_spec}: run `tpupod local up`")
    if spec.get("api") == "compute":
        raise PodError("rollout patches a TPU API node's metadata; a group's template cannot "
                       "change in place (a new template is a new recreate): not on --api compute "
                       "yet")  # fmt: skip
    job = job or running_job(pod)
    info = pod.describe()
    bundle = build_bundle(root, job=job)
    node_metadata = dict(spec["node"].get("metadata") or {})
    old = node_metadata.get(metadata.BUNDLE_SHA256)
    if old == bundle.sha256:
        return {"old": old, "new": bundle.sha256, "changed": False}
    storage.upload_bundle(info.pod["emulator_url"], info.pod.get("bucket", pod.bucket), bundle,
                          operator_token(pod.endpoints()))  # fmt: skip
    node_metadata |= {
        metadata.BUNDLE_OBJECT: bundle.object_name,
        metadata.BUNDLE_SHA256: bundle.sha256,
        metadata.JOB: job.spec.to_json(),
    }
    name = f"{spec['parent']}/nodes/{spec['node_id']}"
    if info.state != SliceState.MISSING:
        tpu_client.patch_metadata(pod.endpoints(), name, node_metadata)
    spec["node"]["metadata"] = node_metadata
    write_json(pod.paths.node_spec, spec)
    return {"old": old, "new": bundle.sha256, "changed": True}
