"""Google's IAM catalog as tpupod ships it (iam_catalog.json, built by `python -m tools.iam_catalog`
from iann0036/iam-dataset; its `source` names the commit and date): which permissions exist, what
each predefined role grants, and which permissions each REST method needs.

One catalog for both sides: the Pulumi program refuses a custom role naming a permission IAM does
not know (as IAM refuses it: HTTP 400 at `pulumi up`), and the local cloud authorises every call
with the same method -> permission map. Pure Python, no tpupod imports.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

CATALOG_PATH = Path(__file__).resolve().parent / "iam_catalog.json"
OWNER = "roles/owner"


class CatalogError(ValueError):
    """A role, permission or method the catalog does not know."""


@dataclass(frozen=True)
class Check:
    """One permission a method needs; `when` names the case it is checked in (None: always)."""

    permission: str
    when: str | None = None


@dataclass(frozen=True)
class Catalog:
    source: Mapping[str, object]
    services: Mapping[str, str]  # permission prefix -> service name (tpu -> tpu.googleapis.com)
    permissions: frozenset[str]  # every valid permission of those services
    roles: Mapping[str, frozenset[str]]  # predefined role -> its permissions (those services')
    methods: Mapping[str, tuple[Check, ...]]  # REST method id -> its checks

    def service_of(self, permission: str) -> str:
        prefix = permission.split(".", 1)[0]
        try:
            return self.services[prefix]
        except KeyError:
            raise CatalogError(f"permission {permission!r}: no service in the catalog") from None

    def covers(self, permission: str) -> bool:
        """True when the permission's service is one the catalog lists in full."""
        return permission.split(".", 1)[0] in self.services

    def unknown(self, permissions: Iterable[str]) -> list[str]:
        """The permissions IAM would refuse in a custom role (of the services the catalog covers,
        any not granted by some predefined role; of other services, all: tpupod cannot tell)."""
        return [p for p in permissions if p not in self.permissions]

    def role(self, name: str, custom: Mapping[str, Iterable[str]] | None = None) -> frozenset[str]:
        """A predefined role's permissions, or a custom role's (`projects/P/roles/ID`)."""
        if name in self.roles:
            return self.roles[name]
        if custom is not None and name in custom:
            return frozenset(custom[name])
        raise CatalogError(f"role {name!r} is not in tpupod's IAM catalog ({CATALOG_PATH.name})")

    def needs(self, method: str, cases: Iterable[str] = ()) -> list[str]:
        """The permissions `method` needs in `cases` (e.g. "overwrite", "service_account")."""
        try:
            checks = self.methods[method]
        except KeyError:
            raise CatalogError(f"method {method!r} is not in tpupod's IAM catalog") from None
        present = set(cases)
        return [c.permission for c in checks if c.when is None or c.when in present]


@functools.cache
def catalog() -> Catalog:
    raw = json.loads(CATALOG_PATH.read_text())
    return Catalog(
        source=raw["source"],
        services=raw["services"],
        permissions=frozenset(raw["permissions"]),
        roles={name: frozenset(perms) for name, perms in raw["roles"].items()},
        methods={
            name: tuple(Check(c["permission"], c.get("when")) for c in checks)
            for name, checks in raw["methods"].items()
        },
    )
