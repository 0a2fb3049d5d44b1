"""pulumi-policy pack over `infra.policies`: `pulumi preview --policy-pack policy`.

Each rule in `infra.policies.RULES` becomes one mandatory resource validation policy and each
`STACK_RULES` entry one stack validation policy; the predicates are imported, not copied, so the
tests and the pack enforce exactly the same rules.
"""

import sys
from pathlib import Path

from pulumi_policy import (
    EnforcementLevel,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: `infra`

from infra.policies import RULES, STACK_RULES, Rule, StackRule  # noqa: E402


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


def as_stack_policy(rule: StackRule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [(r.resource_type, r.props) for r in args.resources]
        for message in rule.check(resources):
            report_violation(message, None)

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        enforcement_level=EnforcementLevel.MANDATORY,
        validate=validate,
    )


def policies() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    return [as_policy(rule) for rule in RULES] + [as_stack_policy(rule) for rule in STACK_RULES]


if __name__ == "__main__":
    PolicyPack(name="tpupod-security", policies=policies())
