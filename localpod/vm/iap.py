"""The local pod's IAP stand-in: a ProxyCommand shaped like gcloud's IAP tunnel.

    python -m localpod.vm.iap INSTANCE 22 --listen-on-stdin --zone Z --project P --endpoints FILE

does what `gcloud compute start-iap-tunnel INSTANCE 22 --listen-on-stdin --zone Z --project P`
does for `gcloud compute tpus tpu-vm ssh --tunnel-through-iap`: it resolves INSTANCE among the
Compute Engine instances of that project and zone (a slice through Compute Engine), else among
the TPU workers, by the `hostname` guest attribute the TPU API serves for each, and relays stdin/stdout to that worker's SSH port. Only a real instance name of a
live node resolves; anything else is one line on stderr and exit 1, as gcloud fails.

It acts as the operator, whose gcloud credentials the real tunnel carries: its TPU API calls send
the operator's token, and the tunnel itself is authorised as IAP authorises one
(iap.tunnelInstances.accessViaIAP, by the pod's gate).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

from localpod.gcp.authz import Denied, Gate
from localpod.gcp.identities import operator_token
from localpod.state import PodError

ERROR = "ERROR: (gcloud.compute.start-iap-tunnel) "
TUNNEL = "iap.tunnelInstances.connect"  # the catalog's entry for a tunnel (not a REST method)
CONNECT_FAILED = ERROR + "Error while connecting [4003: 'failed to connect to backend']."
_CHUNK = 65536


class TunnelError(Exception):
    """Why the tunnel cannot be opened: one line, as gcloud prints it."""


def _call(url: str, token: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {err.code}"
        raise TunnelError(ERROR + message) from None
    except (urllib.error.URLError, OSError) as err:
        raise TunnelError(ERROR + f"cannot reach the TPU API at {url}: {err}") from None


def authorize_tunnel(endpoints: dict, token: str, project: str, zone: str, instance: str) -> None:
    """IAP's own check: may the caller tunnel to this instance (the pod's gate, if it has one)."""
    gate = Gate.for_pod(Path(endpoints["spec_file"]).parent)
    if gate is None:
        return
    name = f"projects/{project}/zones/{zone}/instances/{instance}"
    targets = gate.targets(TUNNEL, name, "compute.googleapis.com/Instance")
    try:
        gate.check(gate.caller(f"Bearer {token}"), "iap.googleapis.com", TUNNEL, targets)
    except Denied as denied:
        why = denied.target.permission if denied.target else denied.kind
        raise TunnelError(
            ERROR + f"Error while connecting [4033: 'not authorized' ({why})]."
        ) from None


def resolve(endpoints: dict, instance: str, zone: str, project: str) -> tuple[str, int]:
    """(address, SSH port) of the VM named `instance`: a Compute Engine instance (its first
    network interface, as gcloud's tunnel reads it), else the TPU worker whose guest-attribute
    hostname it is."""
    try:
        token = operator_token(endpoints)
    except PodError as err:
        raise TunnelError(ERROR + str(err)) from None
    if endpoints.get("compute_api"):
        url = f"{endpoints['compute_api']}compute/v1/projects/{project}/zones/{zone}/instances"
        try:
            vm = _call(f"{url}/{instance}", token)
        except TunnelError as err:
            if "was not found" not in str(err):
                raise
        else:
            address = (vm.get("networkInterfaces") or [{}])[0].get("networkIP")
            port = endpoints["ssh"]["ports"].get(address)
            if port is None:
                raise TunnelError(CONNECT_FAILED)
            authorize_tunnel(endpoints, token, project, zone, instance)
            return address, int(port)
    location = f"{endpoints['tpu_api']}v2/projects/{project}/locations/{zone}"
    for node in _call(f"{location}/nodes", token).get("nodes", []):
        name = node["name"].rsplit("/", 1)[-1]
        answer = _call(f"{location}/nodes/{name}:getGuestAttributes", token, {})
        for index, worker in enumerate(answer.get("guestAttributes", [])):
            items = worker.get("queryValue", {}).get("items", [])
            hostnames = [i["value"] for i in items if i.get("key") == "hostname"]
            if instance in hostnames:
                address = node["networkEndpoints"][index]["ipAddress"]
                port = endpoints["ssh"]["ports"].get(address)
                if port is None:
                    raise TunnelError(CONNECT_FAILED)
                authorize_tunnel(endpoints, token, project, zone, instance)
                return address, int(port)
    raise TunnelError(
        ERROR + "Could not fetch resource: The resource "
        f"'projects/{project}/zones/{zone}/instances/{instance}' was not found"
    )


def relay(sock: socket.socket) -> None:
    """stdin -> socket (half-close at EOF) in a thread; socket -> stdout until the peer closes."""

    def upstream() -> None:
        try:
            while data := os.read(0, _CHUNK):
                sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=upstream, daemon=True).start()
    while data := sock.recv(_CHUNK):
        os.write(1, data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localpod.vm.iap", description=__doc__)
    parser.add_argument("instance")
    parser.add_argument("port", type=int)
    parser.add_argument("--listen-on-stdin", action="store_true", required=True)
    parser.add_argument("--zone", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--endpoints", type=Path, required=True, help="the pod's endpoints.json")
    args = parser.parse_args(argv)
    try:
        try:
            endpoints = json.loads(args.endpoints.read_text())
        except (OSError, ValueError) as err:
            raise TunnelError(ERROR + f"cannot read {args.endpoints}: {err}") from None
        address, port = resolve(endpoints, args.instance, args.zone, args.project)
        if args.port != 22:  # the VM's sshd listens on 22 only
            raise TunnelError(CONNECT_FAILED)
        try:
            sock = socket.create_connection((address, port), timeout=10)
        except OSError:
            raise TunnelError(CONNECT_FAILED) from None
    except TunnelError as err:
        print(err, file=sys.stderr)
        return 1
    sock.settimeout(None)
    with sock:
        try:
            relay(sock)
        except OSError:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
