"""A TPU slice on GCP: state from the TPU API (gcloud), re-creation through the Pulumi CLI.

Only CLIs, no Python SDKs: `gcloud compute tpus tpu-vm describe|delete` and `pulumi stack output`
/ `pulumi up --replace <tpu urn>`, run from the project root so that the CLI honours
`stackConfigDir` (the Automation API does not). Every subprocess goes through one `Runner`, the
only place a test substitutes a table-driven double (gcloud and Pulumi have no emulator).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from ops.provider import ProviderError, SliceInfo, SliceState, Worker

Runner = Callable[[Sequence[str], Path], subprocess.CompletedProcess]

# Missing CLI -> the one line that says what to install.
INSTALL_HINTS = {
    "gcloud": "gcloud is not installed: install the Google Cloud CLI "
    "(https://cloud.google.com/sdk/docs/install), then run `gcloud auth login`",
    "pulumi": "the Pulumi CLI is not installed: install it (curl -fsSL https://get.pulumi.com | sh), "
    "then run `pulumi login`",
}
# Fragments of a CLI's stderr -> what the user has to run.
CREDENTIAL_HINTS = {
    "gcloud auth login": "gcloud has no credentials: run `gcloud auth login`",
    "reauthentication": "gcloud credentials expired: run `gcloud auth login`",
    "PULUMI_ACCESS_TOKEN": "Pulumi is not logged in: run `pulumi login`",
    "pulumi login": "Pulumi is not logged in: run `pulumi login`",
}
NOT_FOUND_MARKERS = ("NOT_FOUND", "was not found", "not found")
# How ops reaches a worker: TPUPOD_SSH_VIA selects the address (or a ProxyCommand template).
IAP_PROXY = (
    "gcloud compute start-iap-tunnel {instance} 22 --listen-on-stdin "
    "--zone {zone} --project {project} --verbosity warning"
)
PULUMI_UP_TIMEOUT = 3600.0


def subprocess_runner(argv: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    """Runs a CLI for real; a missing executable becomes a one-line ProviderError."""
    if shutil.which(argv[0]) is None:
        raise ProviderError(INSTALL_HINTS.get(argv[0], f"{argv[0]} is not installed"))
    timeout = PULUMI_UP_TIMEOUT if argv[:2] == ["pulumi", "up"] else 120.0
    return subprocess.run(
        list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def _failure(proc: subprocess.CompletedProcess, what: str) -> ProviderError:
    stderr = proc.stderr or ""
    for fragment, hint in CREDENTIAL_HINTS.items():
        if fragment in stderr:
            return ProviderError(hint)
    last = next((ln for ln in reversed(stderr.strip().splitlines()) if ln.strip()), "no output")
    return ProviderError(f"{what} failed (exit {proc.returncode}): {last.strip()}")


class GcpProvider:
    """One Pulumi stack's TPU slice."""

    def __init__(self, stack: str, root: Path, runner: Runner = subprocess_runner):
        self.name = stack
        self.stack = stack
        self.root = root
        self.run = runner
        self._outputs: dict | None = None

    # -- Pulumi ------------------------------------------------------------------------------
    def outputs(self, refresh: bool = False) -> dict:
        """`pulumi stack output --json`: tpu_urn, tpu_name, zone, project, worker_internal_ips."""
        if self._outputs is None or refresh:
            proc = self.run(
                ["pulumi", "stack", "output", "--json", "--stack", self.stack], self.root
            )
            if proc.returncode != 0:
                err = _failure(proc, "pulumi stack output")
                if "no stack named" in (proc.stderr or ""):
                    err = ProviderError(self._not_deployed())
                raise err
            outputs = json.loads(proc.stdout or "{}")
            if not outputs.get("tpu_urn") or not outputs.get("tpu_name"):
                raise ProviderError(self._not_deployed())
            self._outputs = outputs
        return self._outputs

    def _not_deployed(self) -> str:
        return f"stack {self.stack!r} has not been deployed: run `pulumi up --stack {self.stack}`"

    def pulumi_up_command(self) -> list[str]:
        """The exact command that replaces the TPU node (and only it)."""
        urn = self.outputs()["tpu_urn"]
        return ["pulumi", "up", "--stack", self.stack, "--yes", "--replace", urn]

    # -- TPU API -----------------------------------------------------------------------------
    def _gcloud(self, verb: str, *extra: str) -> list[str]:
        out = self.outputs()
        return [
            "gcloud", "compute", "tpus", "tpu-vm", verb, out["tpu_name"],
            "--zone", out["zone"], "--project", out["project"], *extra,
        ]  # fmt: skip

    def describe(self) -> SliceInfo:
        proc = self.run(self._gcloud("describe", "--format=json"), self.root)
        if proc.returncode != 0:
            if any(marker in (proc.stderr or "") for marker in NOT_FOUND_MARKERS):
                return SliceInfo(SliceState.MISSING, detail="node not found")
            raise _failure(proc, "gcloud compute tpus tpu-vm describe")
        node = json.loads(proc.stdout or "{}")
        state = SliceState.parse(node.get("state"))
        return SliceInfo(
            state=state,
            health=node.get("health"),
            workers=self.workers(node) if state is SliceState.READY else [],
            detail=node.get("healthDescription") or node.get("state"),
        )

    def workers(self, node: dict) -> list[Worker]:
        """Endpoints in worker order: Pulumi's stack output first, the node's own as fallback."""
        out = self.outputs()
        endpoints = node.get("networkEndpoints") or []
        internal = out.get("worker_internal_ips") or [e.get("ipAddress") for e in endpoints]
        external = [(e.get("accessConfig") or {}).get("externalIp") for e in endpoints]
        via = os.environ.get("TPUPOD_SSH_VIA", "internal")
        user = os.environ.get("TPUPOD_SSH_USER") or getpass.getuser()
        key = os.environ.get("TPUPOD_SSH_KEY") or _default_key()
        template = os.environ.get("TPUPOD_SSH_PROXY") or (IAP_PROXY if via == "iap" else None)
        workers = []
        for index, ip in enumerate(internal):
            host = external[index] if via == "external" and index < len(external) else ip
            proxy = None
            if template:
                proxy = template.format(
                    instance=f"{out['tpu_name']}-w-{index}", ip=ip, zone=out["zone"],
                    project=out["project"], worker=index, tpu=out["tpu_name"],
                )  # fmt: skip
            workers.append(Worker(index, host, 22, user, key, proxy))
        return workers

    def delete(self) -> None:
        proc = self.run(self._gcloud("delete", "--quiet"), self.root)
        if proc.returncode != 0 and not any(m in (proc.stderr or "") for m in NOT_FOUND_MARKERS):
            raise _failure(proc, "gcloud compute tpus tpu-vm delete")

    def recreate(self) -> None:
        """1. delete the dead node (a PREEMPTED spot node cannot restart; quota is for one slice)
        2. `pulumi up --replace <tpu urn>`: the declared node comes back with the same metadata
        3. refresh the stack outputs (worker IPs may change)."""
        self.delete()
        proc = self.run(self.pulumi_up_command(), self.root)
        if proc.returncode != 0:
            raise _failure(proc, "pulumi up")
        self.outputs(refresh=True)


def _default_key() -> str | None:
    key = Path.home() / ".ssh" / "google_compute_engine"
    return str(key) if key.exists() else None
