"""pulumi-policy pack over `infra.policies`: `pulumi preview --policy-pack policy`.

Each rule in `infra.policies.RULES` becomes one mandatory resource validation policy; the
predicates are imported, not copied, so the tests and the pack enforce exactly the same rules.
"""

import sys
from pathlib import Path

from pulumi_policy import (
    EnforcementLevel,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: `infra`

from infra.policies import RULES, Rule  # noqa: E402


def as_policy(rule: Rule) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if args.resource_type not in rule.resource_types:
            return
        protect = bool(getattr(args.opts, "protect", False))
        for message in rule.check(args.resource_type, args.props, protect):
            report_violation(message, None)

    return ResourceValidationPolicy(
        name=rule.name,
        description=rule.description,
        enforcement_level=EnforcementLevel.MANDATORY,
        validate=validate,
    )


def policies() -> list[ResourceValidationPolicy]:
    return [as_policy(rule) for rule in RULES]


if __name__ == "__main__":
    PolicyPack(name="tpupod-security", policies=policies())
