"""Provider lookup: `local` is the local pod; any other stack is a Pulumi stack on GCP."""

from __future__ import annotations

from pathlib import Path

from ops.cli import CliError
from ops.provider import Provider

ROOT = Path(__file__).resolve().parents[2]
LOCAL = "local"


def known_stacks(root: Path = ROOT) -> list[str]:
    """`local` plus every `stacks/Pulumi.<stack>.yaml`."""
    found = sorted(
        p.name[len("Pulumi.") : -len(".yaml")] for p in (root / "stacks").glob("Pulumi.*.yaml")
    )
    return [LOCAL, *found]


def get_provider(stack: str, root: Path = ROOT) -> Provider:
    if stack == LOCAL:
        from ops.providers.local import LocalProvider

        return LocalProvider()
    if not (root / "stacks" / f"Pulumi.{stack}.yaml").is_file():
        raise CliError(
            f"unknown stack {stack!r}: stacks are {', '.join(known_stacks(root))}; "
            f"to add one write stacks/Pulumi.{stack}.yaml, run `pulumi stack init {stack}` "
            f"and `pulumi up --stack {stack}`"
        )
    from ops.providers.gcp import GcpProvider

    return GcpProvider(stack, root)
