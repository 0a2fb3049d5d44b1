"""Network: a private VPC for the workers, reachable only through IAP.

Workers get no external IPs, so the subnet has Private Google Access (GCS, TPU APIs) and a Cloud
NAT gives them PyPI and uv's Python downloads. The subnet keeps VPC flow logs (CIS GCP 3.8),
sampled and aggregated so a chatty slice does not flood Cloud Logging. Firewall: SSH only from
IAP plus the narrow ranges the stack lists, everything between workers of this stack (JAX
coordinator, DCN), nothing else inbound.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.component import child_options
from infra.grants import ssh_ingress
from infra.security import IAP_RANGE, LISTED_SSH_MARKER

# VPC flow logs on the workers' subnet: half of the flows sampled (the API default), summarized per
# 5 minutes with metadata: enough for an incident review, cheap for a chatty slice.
FLOW_LOGS = {
    "aggregation_interval": "INTERVAL_5_MIN",
    "flow_sampling": 0.5,
    "metadata": "INCLUDE_ALL_METADATA",
}


@dataclass(frozen=True)
class NetworkArgs:
    name: str  # prefix for every child
    region: str
    subnet_cidr: str
    worker_tag: str
    ssh_source_ranges: tuple[str, ...] = ()
    existing_network: str | None = None  # self link or name; with existing_subnet
    existing_subnet: str | None = None


class Network(pulumi.ComponentResource):
    network: pulumi.Output[str]
    subnetwork: pulumi.Output[str]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpupod:infra:Network", name, None, opts)
        child = child_options(self, opts)

        if args.existing_network and args.existing_subnet:
            self.network = pulumi.Output.from_input(args.existing_network)
            self.subnetwork = pulumi.Output.from_input(args.existing_subnet)
        else:
            vpc = gcp.compute.Network(
                f"{name}-vpc",
                name=f"{args.name}-vpc",
                auto_create_subnetworks=False,
                description="tpupod workers (custom mode; no default subnets)",
                opts=child,
            )
            subnet = gcp.compute.Subnetwork(
                f"{name}-subnet",
                name=f"{args.name}-subnet",
                network=vpc.id,
                region=args.region,
                ip_cidr_range=args.subnet_cidr,
                private_ip_google_access=True,
                log_config=gcp.compute.SubnetworkLogConfigArgs(**FLOW_LOGS),
                opts=child,
            )
            router = gcp.compute.Router(
                f"{name}-router",
                name=f"{args.name}-router",
                network=vpc.id,
                region=args.region,
                opts=child,
            )
            gcp.compute.RouterNat(
                f"{name}-nat",
                name=f"{args.name}-nat",
                router=router.name,
                region=args.region,
                nat_ip_allocate_option="AUTO_ONLY",
                source_subnetwork_ip_ranges_to_nat="LIST_OF_SUBNETWORKS",
                subnetworks=[
                    gcp.compute.RouterNatSubnetworkArgs(
                        name=subnet.id, source_ip_ranges_to_nats=["ALL_IP_RANGES"]
                    )
                ],
                log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
                opts=child,
            )
            self.network = vpc.id
            self.subnetwork = subnet.id

        self._firewall(name, args, child)
        self.register_outputs({"network": self.network, "subnetwork": self.subnetwork})

    def _firewall(self, name: str, args: NetworkArgs, child: pulumi.ResourceOptions) -> None:
        ssh_ingress(f"{name}-ssh-iap", f"{args.name}-ssh-iap", self.network,
                    "SSH to workers through IAP TCP forwarding only", args.worker_tag, child,
                    source_ranges=[IAP_RANGE])  # fmt: skip
        if args.ssh_source_ranges:
            ssh_ingress(f"{name}-ssh-listed", f"{args.name}-ssh-listed", self.network,
                        f"{LISTED_SSH_MARKER}={','.join(args.ssh_source_ranges)}",
                        args.worker_tag, child, source_ranges=args.ssh_source_ranges)  # fmt: skip
        gcp.compute.Firewall(
            f"{name}-internal",
            name=f"{args.name}-internal",
            network=self.network,
            direction="INGRESS",
            description="all traffic between workers of this slice (JAX coordinator, DCN)",
            source_tags=[args.worker_tag],
            target_tags=[args.worker_tag],
            allows=[
                gcp.compute.FirewallAllowArgs(protocol="tcp"),
                gcp.compute.FirewallAllowArgs(protocol="udp"),
                gcp.compute.FirewallAllowArgs(protocol="icmp"),
            ],
            opts=child,
        )
