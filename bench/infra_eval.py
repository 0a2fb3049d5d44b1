"""How long the Pulumi program takes to evaluate offline, apart from importing pulumi_gcp.

`uv run python -m bench.infra_eval [--runs N]` prints {"pulumi_gcp_import_s", "all_stacks_eval_s",
"stacks", "runs"}: each run in a fresh interpreter (a second evaluation in one interpreter would be
warm), the import of pulumi_gcp timed apart (it loads lazily and is large), then the evaluation of
every stack file under mocks. The headline takes the median of the runs (n >= 3). Target: all
stacks together under 5 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from infra import offline


def once() -> dict:
    """One run in this interpreter: the import, then every stack's evaluation."""
    start = time.perf_counter()
    offline.import_provider_sdk()
    import_s = time.perf_counter() - start
    stacks = offline.stack_names()
    start = time.perf_counter()
    for stack in stacks:
        offline.evaluate(stack)
    eval_s = time.perf_counter() - start
    return {"pulumi_gcp_import_s": round(import_s, 3), "all_stacks_eval_s": round(eval_s, 3),
            "stacks": len(stacks)}  # fmt: skip


def run(runs: int = 3) -> dict:
    """`runs` fresh interpreters, one after the other; each run's figures and their count."""
    each = []
    for _ in range(runs):
        result = subprocess.run([sys.executable, "-m", "bench.infra_eval", "--once"],
                                cwd=offline.PROJECT_ROOT, capture_output=True, text=True,
                                check=True)  # fmt: skip
        each.append(json.loads(result.stdout.strip().splitlines()[-1]))
    return {"runs": each, "stacks": each[-1]["stacks"]}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--once", action="store_true", help="one run in this interpreter")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    print(json.dumps(once() if a.once else run(a.runs)))
