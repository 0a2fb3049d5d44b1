"""The Google APIs a slice needs, enabled by the stack, and the Cloud TPU service agent.

A fresh project has none of them on: without this, the first `pulumi up` fails on whichever
resource reaches a disabled API first. Destroying the stack leaves every API enabled
(`disable_on_destroy=False`): other stacks and people in the project use them too. The TPU
service identity (service-PROJECT_NUMBER@cloud-tpu.iam.gserviceaccount.com) is created up front
rather than lazily at the first `nodes.create`, so the node is never created before its agent.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

# API -> why the slice needs it.
REQUIRED = {
    "tpu.googleapis.com": "the TPU VM (and recovery's nodes.create/delete)",
    "compute.googleapis.com": "VPC, subnet, NAT, firewall, the watcher VM",
    "iap.googleapis.com": "SSH through the IAP tunnel (no external IPs)",
    "oslogin.googleapis.com": "OS Login for SSH users",
    "storage.googleapis.com": "the checkpoint bucket",
    "iam.googleapis.com": "the workers' and the watcher's service accounts",
    # The project's IAM bindings (gcp.projects.IAMMember, the watcher's custom role) go through
    # the Resource Manager API, off in a new project.
    "cloudresourcemanager.googleapis.com": "the stack's project IAM bindings and custom role",
    "logging.googleapis.com": "the workers' and the watcher's logs (roles/logging.logWriter)",
    "monitoring.googleapis.com": "the workers' metrics (roles/monitoring.metricWriter)",
}
SECRETS = {"secretmanager.googleapis.com": "the job's secrets (tpupod-job.yaml `secrets:`)"}


@dataclass
class ProjectServicesArgs:
    project: str
    secrets: bool = False  # the job names Secret Manager secrets


class ProjectServices(pulumi.ComponentResource):
    """Every API in REQUIRED (and Secret Manager for a job with secrets), plus the TPU agent.
    Other components depend on this one, so no resource is declared against a disabled API."""

    def __init__(self, name: str, args: ProjectServicesArgs, opts=None):
        super().__init__("tpupod:infra:ProjectServices", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        wanted = {**REQUIRED, **(SECRETS if args.secrets else {})}
        self.services = {
            api: gcp.projects.Service(
                f"{name}-{api.split('.')[0]}",
                project=args.project,
                service=api,
                disable_on_destroy=False,
                disable_dependent_services=False,
                opts=child,
            )
            for api in wanted
        }
        self.tpu_agent = gcp.projects.ServiceIdentity(
            f"{name}-tpu-agent",
            project=args.project,
            service="tpu.googleapis.com",
            opts=pulumi.ResourceOptions(parent=self,
                                        depends_on=[self.services["tpu.googleapis.com"]]),
        )  # fmt: skip
        self.register_outputs({"apis": sorted(wanted), "tpu_agent": self.tpu_agent.email})
