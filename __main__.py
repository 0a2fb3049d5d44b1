"""The tpupod Pulumi program: read the stack's config once, compose the components, export.

All decisions live in `infra/`; this file only wires them (config -> network, bucket, identity,
bundle -> TPU slice) and names the outputs that ops and humans use.
"""

import pulumi

from contract import metadata
from infra import naming
from infra.bucket import CheckpointBucket, CheckpointBucketArgs
from infra.code_bundle import CodeBundle, CodeBundleArgs
from infra.config import load
from infra.identity import WorkerIdentity, WorkerIdentityArgs
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
tpu = TpuSlice(
    "slice",
    TpuSliceArgs(
        name=tpu_name,
        project=config.project,
        zone=config.resolved_zone,
        accelerator_type=accelerator.api_type,
        runtime_version=config.resolved_runtime_version,
        provisioning=config.provisioning,
        network=network.network,
        subnetwork=network.subnetwork,
        service_account_email=identity.email,
        network_tag=naming.network_tag(config),
        metadata=worker_metadata,
        stack=config.stack,
        labels=naming.node_labels(config),
        enable_external_ips=config.enable_external_ips,
        capacity=config.capacity,
    ),
    # Workers boot straight into the startup script: NAT, IAM grants and the bundle come first.
    opts=pulumi.ResourceOptions(depends_on=[services, network, identity, code]),
)

# Recovery off the laptop: a VM in the stack that runs `tpupod watch` (tpupod:watcher: false opts out).
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
            node_spec=tpu.spec,
            labels=labels,
        ),
        # After the slice: at destroy the watcher goes first, so no recovery re-creates what the
        # slice's delete hook removes (a dependsOn edge orders; it replaces nothing).
        opts=pulumi.ResourceOptions(depends_on=[services, network, code, tpu]),
    )
    pulumi.export("watcher_instance", watcher.instance_name)
    pulumi.export("watcher_service_account_email", watcher.email)

pulumi.export("tpu_name", tpu.node.name)
pulumi.export("tpu_urn", tpu.node.urn)
# Contract 2: what `nodes.create` needs to recreate this node without Pulumi (ops `watch`).
pulumi.export("node_spec", tpu.spec)
pulumi.export("zone", config.resolved_zone)
pulumi.export("project", config.project)
pulumi.export("accelerator_type", accelerator.api_type)
pulumi.export("num_hosts", accelerator.hosts)
pulumi.export("worker_internal_ips", tpu.worker_internal_ips)
if config.enable_external_ips:
    pulumi.export("worker_external_ips", tpu.worker_external_ips)
pulumi.export("bucket_url", bucket.url)
pulumi.export("run_id", config.run_id)
pulumi.export("run_dir", worker_metadata[metadata.RUN_DIR])
pulumi.export("bundle_uri", code.uri)
pulumi.export("service_account_email", identity.email)
# IAP tunnelling in `tpu-vm ssh` is gcloud's alpha track only (GA refuses --tunnel-through-iap,
# gcloud 528), and `--worker=all` needs a --command: a shell on worker 0, and one command on all.
_ssh = (f"gcloud alpha compute tpus tpu-vm ssh {tpu_name} --zone {config.resolved_zone} "
        f"--project {config.project} --tunnel-through-iap")  # fmt: skip
pulumi.export("ssh_command", f"{_ssh} --worker=0")
pulumi.export(
    "ssh_all_command", f"{_ssh} --worker=all --command 'tail -n 5 /var/lib/tpupod/job.log'"
)
