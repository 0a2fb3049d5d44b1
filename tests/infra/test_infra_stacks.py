"""Every stack file, evaluated offline: the graph, the outputs, the rules, the golden inventory.

Golden inventories live in tests/infra/golden/<stack>.json (see conftest.py). After an intended
change, rewrite them with `TPUPOD_UPDATE_GOLDEN=1 uv run pytest tests/infra -q` and review the diff.
"""

from __future__ import annotations

import asyncio
import json

import pulumi
import pytest

from contract import metadata
from infra import catalog, naming, offline, policies
from infra.config import parse, raw_from_config_map
from infra.mig_spec import GUEST_ATTRIBUTES_METADATA
from infra.security import IAP_RANGE, OS_LOGIN_METADATA

STACKS = offline.stack_names()
TPU_STACKS = offline.stack_names(api="tpu")  # Compute Engine's own: test_infra_mig_slice.py
TPU = "gcp:tpu/v2Vm:V2Vm"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
FIREWALL = "gcp:compute/firewall:Firewall"


def test_a_stack_evaluates_after_an_asyncio_run_in_the_same_process():
    # asyncio.run leaves the thread with no current event loop, which Pulumi's mocks need (an
    # ops test, or a CLI command, may have run one before): evaluate sets its own.
    asyncio.run(asyncio.sleep(0))
    assert offline.evaluate("v4-8").one(TPU)


def stack_config(stack: str):
    return parse(raw_from_config_map(offline.stack_config(stack)), stack=stack)


def test_required_stacks_exist():
    assert {"v4-8", "v4-32", "v5e-16", "v6e-8"} <= set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_stack_file_is_short_and_valid(stack):
    text = (offline.STACKS_DIR / f"Pulumi.{stack}.yaml").read_text()
    assert len(text.strip().splitlines()) <= 8
    config = stack_config(stack)
    assert config.resolved_zone in config.accelerator.zones


@pytest.mark.parametrize("stack", ["v4-8", "v4-32", "v5e-16", "v6e-8"])
def test_required_stacks_are_spot(stack):
    assert stack_config(stack).provisioning == "spot"


def test_defaults_live_in_code():
    config = parse({"gcp:project": "p", "acceleratorType": "v5e-16"}, stack="s")
    assert (config.provisioning, config.preset, config.enable_external_ips) == (
        "spot",
        "tiny",
        False,
    )
    assert config.protect_bucket and config.resolved_zone == "us-central1-a"
    assert config.resolved_runtime_version == "v2-alpha-tpuv5-lite"
    config = parse(
        {
            "gcp:project": "p",
            "acceleratorType": "v4-8",
            "steps": "20000",
            "trainerArgs": "--seed 3",
        },
        stack="s",
    )
    assert config.trainer_command_args == "--config tiny --steps 20000 --seed 3"


@pytest.mark.parametrize("stack", TPU_STACKS)
def test_tpu_node(evaluations, stack):
    evaluation, config = evaluations[stack], stack_config(stack)
    node = evaluation.one(TPU)
    props = node.inputs
    assert props["name"] == naming.tpu_name(config) and len(props["name"]) <= 63
    assert props["acceleratorType"] == config.accelerator.api_type
    assert props["runtimeVersion"] == config.accelerator.default_runtime_version
    assert props["zone"] == config.resolved_zone
    assert props["schedulingConfig"] == {"spot": True}
    assert props["networkConfig"]["enableExternalIps"] is False
    assert props["serviceAccount"]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert props["serviceAccount"]["email"].startswith(naming.service_account_id(config))
    assert props["tags"] == [naming.network_tag(config)]
    assert props["labels"]["tpupod-stack"] == stack
    assert node.delete_before_replace and node.create_timeout
    assert node.parent.endswith("tpupod:infra:TpuSlice::slice")


@pytest.mark.parametrize("stack", STACKS)
def test_metadata_is_exactly_the_seam(evaluations, stack):
    evaluation, config = evaluations[stack], stack_config(stack)
    bundle = evaluation.one("gcp:storage/bucketObject:BucketObject").inputs["name"]
    sha = bundle.removeprefix("bundles/").removesuffix(".tar.gz")
    expected = metadata.worker_metadata(
        bucket=naming.bucket_name(config),
        bundle_object=bundle,
        bundle_sha256=sha,
        stack=stack,
        job_json=config.job_definition().spec.to_json(),
        run_id=config.run_id,
        uv_group="tpu",
    )
    # The same metadata on either path: the TPU API's node, or Compute Engine's template.
    actual = (evaluation.of_type(TPU) or evaluation.of_type(TEMPLATE))[0].inputs["metadata"]
    # A Compute Engine VM publishes its SSH host keys (guest attributes) only when told to.
    on_compute = {} if evaluation.of_type(TPU) else GUEST_ATTRIBUTES_METADATA
    assert actual == {**expected, **OS_LOGIN_METADATA, **on_compute}
    assert actual[metadata.STARTUP_SCRIPT] == metadata.startup_script()
    # The stack's preset is the built-in trainer's job, declared in the job format.
    job = json.loads(actual[metadata.JOB])
    assert job["run"].startswith(f"exec python -m trainer --config {config.preset}")
    assert job["exit_codes"] == {"preempted": [75], "fatal": [2]}
    assert actual[metadata.RUN_DIR] == f"gs://{naming.bucket_name(config)}/runs/{stack}/main"


@pytest.mark.parametrize("stack", STACKS)
def test_network_bucket_identity(evaluations, stack):
    evaluation = evaluations[stack]
    assert evaluation.one("gcp:compute/network:Network").inputs["autoCreateSubnetworks"] is False
    assert evaluation.one("gcp:compute/subnetwork:Subnetwork").inputs["privateIpGoogleAccess"]
    assert (
        evaluation.one("gcp:compute/routerNat:RouterNat").inputs["natIpAllocateOption"]
        == "AUTO_ONLY"
    )
    firewalls = {r.name: r.inputs for r in evaluation.of_type(FIREWALL)}
    assert firewalls["network-ssh-iap"]["sourceRanges"] == [IAP_RANGE]
    internal = firewalls["network-internal"]
    assert {a["protocol"] for a in internal["allows"]} == {"tcp", "udp", "icmp"}
    assert internal["sourceTags"] == internal["targetTags"]
    bucket = evaluation.one("gcp:storage/bucket:Bucket")
    assert bucket.protect and not bucket.inputs["forceDestroy"]
    assert bucket.inputs["lifecycleRules"]
    workers = [r for r in evaluation.resources if not r.name.startswith("watcher")]  # its own test
    roles = {r.inputs["role"] for r in workers if "role" in r.inputs}
    assert roles == {
        "roles/storage.bucketViewer",  # the bucket's metadata alone: Orbax reads it
        "roles/storage.objectUser",
        "roles/storage.objectViewer",
        "roles/logging.logWriter",
        "roles/monitoring.metricWriter",
    }
    grants = {
        r.name: r.inputs
        for r in evaluation.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
        if not r.name.startswith("watcher")  # tests/infra/test_infra_watcher.py
    }
    objects = f"projects/_/buckets/{bucket.inputs['name']}/objects/"
    for name, role, prefix in [
        ("workers-bucket-runs", "roles/storage.objectUser", f"runs/{stack}/"),
        ("workers-bucket-compile-cache", "roles/storage.objectUser", f"compile-cache/{stack}/"),
        ("workers-bucket-bundles", "roles/storage.objectViewer", "bundles/"),
        ("workers-bucket-envs", "roles/storage.objectUser", f"envs/{stack}/"),
    ]:
        assert grants[name]["role"] == role
        assert (
            f'resource.name.startsWith("{objects}{prefix}")'
            in grants[name]["condition"]["expression"]
        )
    assert grants["workers-bucket-metadata"]["role"] == "roles/storage.bucketViewer"
    assert "condition" not in grants["workers-bucket-metadata"]  # no object access to limit
    assert len(grants) == 5
    components = {r.urn for r in evaluation.resources if not r.custom}
    assert all(
        r.parent in components
        for r in evaluation.resources
        if r.custom and not r.type.startswith("pulumi:")
    )


@pytest.mark.parametrize("stack", TPU_STACKS)
def test_outputs(evaluations, stack):
    values, config = evaluations[stack].values, stack_config(stack)
    hosts = catalog.lookup(config.accelerator_type).hosts
    assert values["num_hosts"] == hosts
    assert len(values["worker_internal_ips"]) == hosts
    assert "worker_external_ips" not in values
    assert values["tpu_urn"].endswith("gcp:tpu/v2Vm:V2Vm::slice-node")
    assert values["run_dir"] == f"{values['bucket_url']}/runs/{stack}/{values['run_id']}"
    assert values["bundle_uri"].startswith(f"{values['bucket_url']}/bundles/")
    # gcloud's GA track refuses --tunnel-through-iap for tpu-vm ssh; --worker=all needs --command
    ssh = f"gcloud alpha compute tpus tpu-vm ssh {values['tpu_name']} "
    assert values["ssh_command"].startswith(ssh) and values["ssh_all_command"].startswith(ssh)
    assert values["ssh_command"].endswith("--tunnel-through-iap --worker=0")
    assert "--tunnel-through-iap --worker=all --command " in values["ssh_all_command"]
    for key in ("zone", "project", "accelerator_type", "service_account_email", "tpu_name"):
        assert values[key]


@pytest.mark.parametrize("stack", STACKS)
def test_every_security_rule_holds(evaluations, stack):
    found = [
        f"{r.type} {r.name}: {v}"
        for r in evaluations[stack].resources
        for v in policies.violations(r.type, r.inputs, r.protect)
    ]
    found += policies.stack_violations((r.type, r.inputs) for r in evaluations[stack].resources)
    assert found == []


@pytest.mark.parametrize("stack", STACKS)
def test_golden_inventory(evaluations, golden, stack):
    golden(evaluations[stack])


@pytest.fixture
def v4_32() -> offline.Evaluation:
    return offline.evaluate("v4-32")


@pulumi.runtime.test
def test_worker_ips_output(v4_32):
    def check(ips):
        assert ips == ["10.64.0.10", "10.64.0.11", "10.64.0.12", "10.64.0.13"]

    return v4_32.outputs["worker_internal_ips"].apply(check)


@pulumi.runtime.test
def test_bucket_and_account_outputs(v4_32):
    def check(args):
        url, email = args
        assert url == "gs://tpupod-test-project-tpupod-v4-32"
        assert email == "tpupod-v4-32@tpupod-test-project.iam.gserviceaccount.com"

    return pulumi.Output.all(
        v4_32.outputs["bucket_url"], v4_32.outputs["service_account_email"]
    ).apply(check)


def test_a_wrong_expectation_fails(v4_32):
    """Proof that the apply assertions above are awaited: a wrong one must fail the test."""

    @pulumi.runtime.test
    def wrong():
        def check(ips):
            assert len(ips) == 5

        return v4_32.outputs["worker_internal_ips"].apply(check)

    with pytest.raises(AssertionError):
        wrong()


def test_external_ips_opt_in_exports_them():
    config = {**offline.stack_config("v4-32"), "tpupod:enableExternalIps": "true"}
    evaluation = offline.evaluate("v4-32", config)
    assert evaluation.values["worker_external_ips"] == [f"203.0.113.{10 + i}" for i in range(4)]
    node = evaluation.one(TPU)
    assert node.inputs["networkConfig"]["enableExternalIps"] is True
    assert policies.violations(node.type, node.inputs, node.protect) == []


def test_existing_network_and_bucket_are_used_not_created():
    config = {
        **offline.stack_config("v4-8"),
        "tpupod:existingNetwork": "projects/p/global/networks/shared",
        "tpupod:existingSubnet": "projects/p/regions/us-central2/subnetworks/tpu",
        "tpupod:existingBucket": "team-checkpoints",
        "tpupod:sshSourceRanges": '["203.0.113.0/24"]',
    }
    evaluation = offline.evaluate("v4-8", config)
    types = {r.type for r in evaluation.resources}
    assert not types & {
        "gcp:compute/network:Network",
        "gcp:compute/subnetwork:Subnetwork",
        "gcp:storage/bucket:Bucket",
    }
    network_config = evaluation.one(TPU).inputs["networkConfig"]
    assert network_config["network"] == "projects/p/global/networks/shared"
    assert evaluation.values["bucket_url"] == "gs://team-checkpoints"
    listed = next(r for r in evaluation.of_type(FIREWALL) if r.name == "network-ssh-listed")
    assert listed.inputs["sourceRanges"] == ["203.0.113.0/24"]
    assert all(not policies.violations(r.type, r.inputs, r.protect) for r in evaluation.resources)


def test_bucket_protection_opt_out():
    config = {**offline.stack_config("v4-8"), "tpupod:protectBucket": "false"}
    bucket = offline.evaluate("v4-8", config).one("gcp:storage/bucket:Bucket")
    assert bucket.protect is False and bucket.inputs["forceDestroy"] is False
    assert policies.violations(bucket.type, bucket.inputs, bucket.protect) == []


@pytest.mark.parametrize("stack", STACKS)
def test_the_apis_are_enabled_first_and_kept_on_destroy(evaluations, stack):
    """A fresh project has no API on: the stack enables what it uses (never disabling it on
    destroy: other stacks share the project), creates the TPU service agent, and declares
    everything else only once they exist (each resource waits on them: infra/component.py)."""
    from infra.services import REQUIRED

    resources = evaluations[stack].resources
    services = [r for r in resources if r.type == "gcp:projects/service:Service"]
    assert {r.inputs["service"] for r in services} >= set(REQUIRED)
    assert all(r.inputs["disableOnDestroy"] is False for r in services)
    agent = evaluations[stack].one("gcp:projects/serviceIdentity:ServiceIdentity")
    assert agent.inputs["service"] == "tpu.googleapis.com"
    apis = {r.urn for r in services}
    for type_ in (
        TPU,
        TEMPLATE,
        "gcp:compute/instanceGroupManager:InstanceGroupManager",
        FIREWALL,
        "gcp:storage/bucket:Bucket",
        "gcp:compute/network:Network",
        "gcp:serviceaccount/account:Account",
        "gcp:compute/instance:Instance",
    ):
        for r in evaluations[stack].of_type(type_):
            assert apis <= set(r.dependencies), f"{r.name} does not wait for the APIs"
