"""CI trusts no branch and no tag (issue 17.5).

A job that can run on a pull request holds no id-token, no secret and no deploy identity; the
deploy identity is used only by jobs on `main` behind the `production` environment; every
action is pinned to a full commit SHA; CI installs the same hash-pinned uv as the bootstrap; the
workflows pass GitHub's schema; the offline preview the pull-request job runs works.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
DEPLOY = ROOT / ".github" / "workflows" / "deploy.yml"
DEPLOY_IDENTITY = "GCP_DEPLOY_SERVICE_ACCOUNT"
ON_MAIN_PUSH = ("github.event_name == 'push'", "github.ref == 'refs/heads/main'")
PINNED = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def triggers(workflow: dict) -> set[str]:
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    return {on} if isinstance(on, str) else set(on)


def runs_on_pull_requests(workflow: dict, job: dict) -> bool:
    """A job runs on pull requests unless its `if` requires a push to main."""
    condition = str(job.get("if", ""))
    return "pull_request" in triggers(workflow) and not all(c in condition for c in ON_MAIN_PUSH)


def permissions(workflow: dict, job: dict) -> dict:
    granted = job.get("permissions", workflow.get("permissions", "write-all"))
    if isinstance(granted, str):  # read-all / write-all
        return {"id-token": granted.split("-")[0]}
    return granted or {}


def test_workflows_pass_githubs_schema():
    result = subprocess.run(
        [ROOT / ".venv" / "bin" / "check-jsonschema", "--builtin-schema"]
        + ["vendor.github-workflows", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit(path):
    uses = [
        (name, step["uses"])
        for name, job in load(path)["jobs"].items()
        for step in job.get("steps", [])
        if "uses" in step
    ]
    assert uses
    for job, action in uses:
        assert action.startswith("./") or PINNED.match(action), f"{path.name}:{job}: {action}"
    # ...with the version that commit was, for a human and for update tools.
    for line in path.read_text().splitlines():
        if re.match(r"\s*(- )?uses:", line):
            assert re.search(r"@[0-9a-f]{40} # v\d+(\.\d+)*$", line), line


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_pull_request_jobs_hold_no_credentials(path):
    workflow = load(path)
    assert permissions(workflow, {}).get("id-token") != "write"
    for name, job in workflow["jobs"].items():
        if not runs_on_pull_requests(workflow, job):
            continue
        text = yaml.safe_dump(job, width=1000)
        expressions = " ".join(re.findall(r"\$\{\{(.*?)\}\}", text))
        assert permissions(workflow, job).get("id-token") != "write", name
        assert "secrets" not in expressions and DEPLOY_IDENTITY not in text, name
        assert "google-github-actions/auth" not in text and "environment" not in job, name


def test_deploy_identity_only_on_main_behind_production():
    workflow = load(DEPLOY)
    jobs = workflow["jobs"]
    deploying = [name for name, job in jobs.items() if DEPLOY_IDENTITY in yaml.safe_dump(job)]
    assert deploying == ["up"]
    for name in deploying:
        assert jobs[name]["environment"] == "production"
        assert all(c in jobs[name]["if"] for c in ON_MAIN_PUSH)
    assert workflow.get("on", workflow.get(True))["push"]["branches"] == ["main"]
    # Anything else that mints an id-token (the read-only plan) also runs only on main.
    for name, job in jobs.items():
        if permissions(workflow, job).get("id-token") == "write":
            assert all(c in job["if"] for c in ON_MAIN_PUSH), name
    plan = yaml.safe_dump(jobs["plan"])
    assert "GCP_PREVIEW_SERVICE_ACCOUNT" in plan and "pulumi up" not in plan


def test_pull_request_preview_comment_runs_no_branch_code():
    jobs = load(DEPLOY)["jobs"]
    comment = jobs["comment"]
    assert comment["permissions"] == {"pull-requests": "write"}
    assert not any("uses" in step for step in comment["steps"])  # no checkout
    assert jobs["preview"]["permissions"] == {"contents": "read"}


def requirement_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def test_ci_installs_the_bootstraps_hash_pinned_uv():
    startup = (ROOT / "bootstrap" / "startup.sh").read_text()
    embedded = re.search(r"<<'REQUIREMENTS'\n(.*?)\nREQUIREMENTS\n", startup, re.S).group(1)
    ci = (ROOT / ".github" / "uv-requirements.txt").read_text()
    assert requirement_lines(embedded) == requirement_lines(ci)
    version = re.search(r"^export TPUPOD_UV_VERSION=(\S+)$", startup, re.M).group(1)
    assert requirement_lines(ci)[0] == f"uv=={version} \\"
    assert len(re.findall(r"--hash=sha256:[0-9a-f]{64}", ci)) >= 2
    installs = [
        step["run"]
        for path in WORKFLOWS
        for job in load(path)["jobs"].values()
        for step in job.get("steps", [])
        if "pip install" in step.get("run", "")
    ]
    installs.append((ROOT / ".ci" / "run").read_text())
    for text in installs:
        assert "--require-hashes" in text and ".github/uv-requirements.txt" in text, text


def destroys_without_the_program(text: str) -> list[str]:
    """Each `pulumi destroy` command (continuation lines joined; comments are none) lacking
    --run-program: the slice's delete hook runs only with the program, and the CLI refuses a
    plain destroy of a stack that has one."""
    lines = [line.strip() for line in re.sub(r"\s*\\\n\s*", " ", text).splitlines()]
    return [line for line in lines if not line.startswith("#")
            and re.search(r"\bpulumi\s+destroy\b", line) and "--run-program" not in line]  # fmt: skip


def test_a_destroy_runs_the_program():
    texts = {path.name: path.read_text() for path in WORKFLOWS}
    texts[".ci/run"] = (ROOT / ".ci" / "run").read_text()
    assert {name: destroys_without_the_program(text) for name, text in texts.items()} == {
        name: [] for name in texts
    }
    # The negative control: a plain destroy, also split over lines, is caught; with it, not.
    plain = "# pulumi destroy: by hand\npulumi login x\npulumi destroy --yes \\\n  --stack s\n"
    assert destroys_without_the_program(plain) == ["pulumi destroy --yes --stack s"]
    assert destroys_without_the_program(plain.replace("--yes", "--yes --run-program")) == []


def test_offline_preview_reports_a_stack():
    result = subprocess.run(
        [sys.executable, str(ROOT / ".github" / "scripts" / "offline_preview.py"), "v4-8"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "`gcp:tpu/v2Vm:V2Vm`" in result.stdout and "policy: ok" in result.stdout
