"""The tpupod Pulumi program: read the stack's config once, compose the components, export.

All decisions live in `infra/`; this file only wires them (config -> network, bucket, identity,
bundle -> TPU slice) and names the outputs that ops and humans use.
"""

import pulumi

from contract import metadata
from infra import catalog, naming
from infra.bucket import CheckpointBucket, CheckpointBucketArgs
from infra.code_bundle import CodeBundle, CodeBundleArgs
from infra.config import load
from infra.identity import WorkerIdentity, WorkerIdentityArgs
from infra.mig_slice import MigSlice, MigSliceArgs
from infra.network import Network, NetworkArgs
from infra.services import ProjectServices, ProjectServicesArgs
from infra.tpu_slice import TpuSlice, TpuSliceArgs
from infra.watcher_vm import WatcherVm, WatcherVmArgs

config = load()  # RunError on any bad key (a bad job directory too), before any resource exists
job = config.job_definition()
accelerator = config.accelerator
tpu_name = naming.tpu_name(config)
bucket_name = naming.bucket_name(config)
labels = naming.labels(config)

# The APIs first: every other component depends on them (a fresh project has none enabled).
services = ProjectServices(
    "apis", ProjectServicesArgs(project=config.project, secrets=bool(job.spec.secrets))
)
after_apis = pulumi.ResourceOptions(depends_on=[services])
network = Network(
    "network",
    NetworkArgs(
        name=tpu_name,
        region=config.region,
        subnet_cidr=config.subnet_cidr,
        worker_tag=naming.network_tag(config),
        ssh_source_ranges=config.ssh_source_ranges,
        existing_network=config.existing_network,
        existing_subnet=config.existing_subnet,
    ),
    opts=after_apis,
)
bucket = CheckpointBucket(
    "checkpoints",
    CheckpointBucketArgs(
        name=bucket_name,
        location=config.region,
        labels=labels,
        protect=config.protect_bucket,
        existing=config.existing_bucket is not None,
        soft_delete_days=config.soft_delete_days,
    ),
    opts=after_apis,
)
identity = WorkerIdentity(
    "workers",
    WorkerIdentityArgs(
        account_id=naming.service_account_id(config),
        project=config.project,
        bucket=bucket.name,
        stack=config.stack,
        read_data=config.data_in_stack_bucket,
        secrets=tuple(sorted(set(job.spec.secrets.values()))),
    ),
    opts=after_apis,
)
code = CodeBundle("code", CodeBundleArgs(bucket=bucket.name, job=job))
worker_metadata = metadata.worker_metadata(
    bucket=bucket_name,
    bundle_object=code.object_name,
    bundle_sha256=code.bundle.sha256,
    stack=config.stack,
    job_json=job.spec.to_json(),
    run_id=config.run_id,
    uv_group="tpu",
    coordinator_port=config.coordinator_port,
)
# Workers boot straight into the startup script: NAT, IAM grants and the bundle come first.
after_base = pulumi.ResourceOptions(depends_on=[services, network, identity, code])
on_compute = config.resolved_api == catalog.COMPUTE
# What both kinds of slice take: the same network, identity, metadata and labels.
common = dict(
    name=tpu_name,
    project=config.project,
    zone=config.resolved_zone,
    provisioning=config.provisioning,
    network=network.network,
    subnetwork=network.subnetwork,
    service_account_email=identity.email,
    network_tag=naming.network_tag(config),
    metadata=worker_metadata,
    labels=naming.node_labels(config),
    capacity=config.capacity,
)
if on_compute:  # tpupod:api: compute: a MIG under a workload policy (TPU7x, v6e, v5p)
    slice_ = MigSlice(
        "slice",
        MigSliceArgs(**common, accelerator=accelerator, reservation=config.reservation),
        opts=after_base,
    )
else:
    slice_ = tpu = TpuSlice(
        "slice",
        TpuSliceArgs(
            **common,
            accelerator_type=accelerator.api_type,
            runtime_version=config.resolved_runtime_version,
            stack=config.stack,
            enable_external_ips=config.enable_external_ips,
        ),
        opts=after_base,
    )

# Recovery off the laptop: a VM in the stack that runs `tpupod watch` (tpupod:watcher: false opts out),
# with a role for the slice's API (a TPU API node, or a Compute Engine group).
if config.watcher:
    watcher = WatcherVm(
        "watcher",
        WatcherVmArgs(
            name=naming.gce_name("tpupod", config.stack, "watcher"),
            account_id=naming.gce_name("tpupod", config.stack)[:23].rstrip("-") + "-watch",
            project=config.project,
            zone=config.resolved_zone,
            stack=config.stack,
            machine_type=config.watcher_machine_type,
            subnetwork=network.subnetwork,
            network=network.network,
            bucket=bucket.name,
            worker_service_account=identity.email,
            worker_tag=naming.network_tag(config),
            node_spec=slice_.spec,
            labels=labels,
            api=config.resolved_api,
        ),
        # After the slice: at destroy the watcher goes first, so no recovery re-creates what the
        # slice's delete hook removes (a dependsOn edge orders; it replaces nothing).
        opts=pulumi.ResourceOptions(depends_on=[services, network, code, slice_]),
    )
    pulumi.export("watcher_instance", watcher.instance_name)
    pulumi.export("watcher_service_account_email", watcher.email)

# Contract 2: what recreates this slice without Pulumi (ops `watch`): a TPU API node's
# `nodes.create` body, or (api: compute) the Compute Engine bodies of its policy, template, MIG.
pulumi.export("node_spec", slice_.spec)
pulumi.export("slice_api", config.resolved_api)
pulumi.export("zone", config.resolved_zone)
pulumi.export("project", config.project)
pulumi.export("accelerator_type", accelerator.api_type)
pulumi.export("num_hosts", accelerator.hosts)
pulumi.export("bucket_url", bucket.url)
pulumi.export("run_id", config.run_id)
pulumi.export("run_dir", worker_metadata[metadata.RUN_DIR])
pulumi.export("bundle_uri", code.uri)
pulumi.export("service_account_email", identity.email)
if on_compute:
    pulumi.export("mig", slice_.manager.name)
    pulumi.export("region", config.region)
    pulumi.export("workload_policy", slice_.policy.name)
    pulumi.export("instances_command",
                  f"gcloud compute instance-groups managed list-instances {tpu_name} "
                  f"--zone {config.resolved_zone} --project {config.project}")  # fmt: skip
    # One VM by name (from instances_command) through IAP: gcloud compute ssh VM --zone Z ...
    pulumi.export("ssh_command", f"gcloud compute ssh --zone {config.resolved_zone} "
                  f"--project {config.project} --tunnel-through-iap")  # fmt: skip
else:
    pulumi.export("tpu_name", tpu.node.name)
    pulumi.export("tpu_urn", tpu.node.urn)
    pulumi.export("worker_internal_ips", tpu.worker_internal_ips)
    if config.enable_external_ips:
        pulumi.export("worker_external_ips", tpu.worker_external_ips)
    # IAP tunnelling in `tpu-vm ssh` is gcloud's alpha track only (GA refuses
    # --tunnel-through-iap, gcloud 528), and `--worker=all` needs a --command: a shell on worker
    # 0, and one command on all.
    _ssh = (f"gcloud alpha compute tpus tpu-vm ssh {tpu_name} --zone {config.resolved_zone} "
            f"--project {config.project} --tunnel-through-iap")  # fmt: skip
    pulumi.export("ssh_command", f"{_ssh} --worker=0")
    pulumi.export(
        "ssh_all_command", f"{_ssh} --worker=all --command 'tail -n 5 /var/lib/tpupod/job.log'"
    )
