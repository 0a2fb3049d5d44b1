"""How long the Pulumi program takes to evaluate offline, apart from importing pulumi_gcp.

`uv run python -m bench.infra_eval` prints {"pulumi_gcp_import_s", "all_stacks_eval_s", "stacks"}.
The import is timed in a fresh interpreter (pulumi_gcp loads lazily and is large); the
evaluation of every stack file, under mocks, in this one after the SDK is imported. Target: all
stacks together under 5 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from infra import offline

_IMPORT_PROBE = (
    "import time; t = time.perf_counter(); "
    "from infra.offline import import_provider_sdk; import_provider_sdk(); "
    "print(time.perf_counter() - t)"
)


def provider_import_seconds() -> float:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE],
        cwd=offline.PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(result.stdout.strip().splitlines()[-1])


def run() -> dict:
    import_s = provider_import_seconds()
    offline.import_provider_sdk()
    stacks = offline.stack_names()
    start = time.perf_counter()
    for stack in stacks:
        offline.evaluate(stack)
    eval_s = time.perf_counter() - start
    return {
        "pulumi_gcp_import_s": round(import_s, 3),
        "all_stacks_eval_s": round(eval_s, 3),
        "stacks": len(stacks),
    }


if __name__ == "__main__":
    print(json.dumps(run()))
