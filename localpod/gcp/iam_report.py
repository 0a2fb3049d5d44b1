"""Least privilege, measured: what the pod's audit log (localpod.gcp.authz) says about its IAM.

Every decision of every local API is in `iam/audit.jsonl` with the role that granted it. From it
and the stack's policy: the calls refused (a grant missing: on GCP, a failure), the calls to a
service the stack did not enable, and, per identity, each role granted to it none of whose
permissions it used (a grant too many), apart from roles for APIs the local cloud does not serve
(Cloud Logging and Monitoring: nothing local receives logs or metrics, so their use cannot be
seen here; docs/seams.md lists them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from contract.iam import catalog
from localpod.gcp.authz import POLICY_FILE, read_audit
from localpod.gcp.iam_policy import Policy

UNSERVED = frozenset({"logging.googleapis.com", "monitoring.googleapis.com"})


@dataclass
class IamReport:
    calls: int = 0  # distinct decisions in the audit log
    denied: list[dict] = field(default_factory=list)  # a permission refused
    disabled: list[dict] = field(default_factory=list)  # a service the stack did not enable
    unused: dict[str, list[str]] = field(default_factory=dict)  # member -> roles never used
    unserved: dict[str, list[str]] = field(default_factory=dict)  # member -> roles not judged

    @property
    def least_privilege(self) -> bool:
        return not (self.denied or self.disabled or any(self.unused.values()))

    def lines(self) -> list[str]:
        members = sorted({*self.unused, *self.unserved})
        head = (f"{self.calls} distinct calls by {len(members)} identities: "
                f"{len(self.denied)} refused, {len(self.disabled)} to a disabled service")  # fmt: skip
        out = [head]
        out += [f"refused: {d['member']} {d['permission']} on {d['resource']}"
                for d in self.denied]  # fmt: skip
        out += [f"never used: {m} {role}" for m, roles in self.unused.items() for role in roles]
        not_judged = sorted({r for roles in self.unserved.values() for r in roles})
        if not_judged:
            out.append(f"not judged (no local API): {', '.join(not_judged)}")
        return out


def serves(policy: Policy, role: str) -> bool:
    """Some permission of `role` belongs to an API the local cloud serves."""
    perms = catalog().role(role, policy.custom_roles)
    return any(catalog().service_of(p) not in UNSERVED for p in perms if catalog().covers(p))


def summarize(pod_dir: Path) -> IamReport:
    policy = Policy.from_json(json.loads((Path(pod_dir) / POLICY_FILE).read_text()))
    audit = read_audit(pod_dir)
    report = IamReport(calls=len(audit))
    report.denied = [a for a in audit if not a["allowed"] and a.get("why") != "disabled"]
    report.disabled = [a for a in audit if a.get("why") == "disabled"]
    used = {(a["member"], a["role"]) for a in audit if a["allowed"]}
    acting = {a["member"] for a in audit}
    for binding in policy.bindings:
        member = binding.member
        if member not in acting or ":" not in member or member.split(":")[0] not in (
            "serviceAccount", "user"):  # fmt: skip
            continue  # an identity that never acted here, or a convenience member
        if not serves(policy, binding.role):
            report.unserved.setdefault(member, []).append(binding.role)
        elif (member, binding.role) not in used:
            report.unused.setdefault(member, []).append(binding.role)
        else:
            report.unused.setdefault(member, [])
    return report
