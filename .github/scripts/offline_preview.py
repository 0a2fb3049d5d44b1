"""The pull-request preview, without the cloud: every stack under Pulumi's mocks.

A branch's code runs here before anyone reviewed it, so the job that runs this holds no cloud
credential, no id-token and no Pulumi secret (.github/workflows/deploy.yml). It prints, as
Markdown, what each stack declares and every violation of the security rules that the policy
pack enforces on `pulumi preview` (the same `infra.policies` predicates), and exits 1 when a
stack fails to evaluate or breaks a rule. The real diff against live state is the `plan` job's,
on main, with a read-only identity.

    uv run python .github/scripts/offline_preview.py [STACK ...]   # default: every stack
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: `infra`

from infra import offline, policies  # noqa: E402


def preview(stack: str) -> tuple[list[str], bool]:
    """Markdown lines for one stack, and whether it evaluated and passed every rule."""
    evaluation = offline.evaluate(stack, check=False)
    lines = [f"### `{stack}` (offline, under mocks)", ""]
    if evaluation.error is not None:
        first = (str(evaluation.error).strip().splitlines() or [""])[0]
        return [*lines, f"**program error**: {type(evaluation.error).__name__}: {first}"], False
    resources = [r for r in evaluation.resources if not r.type.startswith("pulumi:providers:")]
    found = [
        f"`{r.name}`: {message}"
        for r in resources
        for message in policies.violations(r.type, r.inputs, r.protect)
    ]
    found += policies.stack_violations((r.type, r.inputs) for r in resources)
    lines += ["| resource type | name | protected |", "| --- | --- | --- |"]
    lines += [f"| `{r.type}` | `{r.name}` | {'yes' if r.protect else ''} |" for r in resources]
    lines += ["", f"outputs: {', '.join(f'`{k}`' for k in sorted(evaluation.outputs)) or 'none'}"]
    lines += ["", *(f"- **policy violation** {v}" for v in found)] if found else ["", "policy: ok"]
    return [*lines, ""], not found


def main(argv: list[str]) -> int:
    known = offline.stack_names()
    unknown = [s for s in argv if s not in known]
    if unknown:
        print(
            f"error: no stacks/Pulumi.{unknown[0]}.yaml; stacks: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    offline.import_provider_sdk()
    ok = True
    for stack in argv or known:
        lines, passed = preview(stack)
        print("\n".join(lines))
        ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
