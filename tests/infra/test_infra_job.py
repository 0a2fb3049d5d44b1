"""The job contract's file (contract/job.py): every bad key is one line naming the key and the file,
`tpupod job check` and `tpupod local up --job` refuse it with exit 2 and start nothing; a job's
directory ships in the bundle; a stack names its job with `tpupod:job`."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from contract import job as jobs
from infra import builtin_job
from infra.bundle_archive import build_bundle
from infra.config import parse
from infra.config_checks import ConfigError

REPO = Path(__file__).resolve().parents[2]


def make(tmp_path: Path, text: str, **files: str) -> Path:
    (tmp_path / "tpupod-job.yaml").write_text(text)
    for name, content in files.items():
        (tmp_path / name.replace("__", ".")).write_text(content)
    return tmp_path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("steps: 3\n", "key `run` is required"),
        ("run: x\nfoo: 1\n", "key `foo`: unknown key; known keys: run, env, python"),
        ("run: x\nsteps: 0\n", "key `steps`: Input should be greater than 0"),
        ("run: x\npython: conda\n", "key `python`: Input should be 'none', 'uv' or 'requirements'"),
        ("run: x\nprogress: {regex: abc}\n", "key `progress.regex`: 'abc' needs a group"),
        ("run: x\nprogress: fast\n", "key `progress`: use `status`, `none` or"),
        ("run: x\nenv: {TPUPOD_RUN_ID: mine}\n", "key `env`: TPUPOD_RUN_ID is set by tpupod"),
        ("run: x\nenv: {PATH: /x}\n", "key `env`: PATH is set by tpupod"),
        ("run: x\nsecrets: [a-b]\n", "key `secrets`: 'a-b' cannot be an environment variable"),
        ("run: x\nsecrets: {TOKEN: 'has space'}\n", "'has space' is not a Secret Manager"),
        ("run: x\nexit_codes: {fatal: [0]}\n", "key `exit_codes.fatal`: 0 is not an exit code"),
        ("run: x\nexit_codes: {fatal: [75]}\n", "code 75 is both preempted and fatal"),
        ("run: x\ngrace_s: 1.5\n", "key `grace_s`"),
        ("run: [unclosed\n", "not YAML (line 2)"),
        ("- run: x\n", "expected a mapping with at least `run: COMMAND`"),
    ],
)
def test_a_bad_job_file_is_one_line_naming_the_key_and_file(tmp_path, text, expected):
    with pytest.raises(jobs.JobError) as err:
        jobs.load(make(tmp_path, text))
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'tpupod-job.yaml'}: ") and expected in message
    assert "\n" not in message


def test_a_python_mode_needs_its_files(tmp_path):
    with pytest.raises(jobs.JobError, match=r"`python: uv` needs uv.lock beside it"):
        jobs.load(make(tmp_path, "run: x\npython: uv\n", pyproject__toml="[project]\n"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(jobs.JobError, match="no tpupod-job.yaml"):
        jobs.load(empty)


def test_the_defaults_and_the_spec_as_metadata_carries_it(tmp_path):
    job = jobs.load(make(tmp_path, "run: python t.py\nsecrets: [TOKEN]\n", t__py="print(1)\n"))
    spec = job.spec
    assert (spec.python, spec.progress, spec.max_restarts, spec.grace_s) == (
        "none",
        "status",
        3,
        60,
    )
    assert spec.exit_codes.preempted == (75,) and spec.exit_codes.fatal == (2,)
    assert spec.secrets == {"TOKEN": "TOKEN"}
    assert jobs.spec_from_json(spec.to_json()) == spec
    assert set(job.files) == {"tpupod-job.yaml", "t.py"}


def test_the_job_directory_ships_in_the_bundle_with_its_modes(tmp_path):
    root = make(tmp_path, "run: ./go.sh\n", go__sh="#!/bin/sh\necho go\n")
    (root / "go.sh").chmod(0o755)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"junk")
    job = jobs.load(root)
    bundle = build_bundle(job=job)
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["job/go.sh"].mode == 0o755 and members["job/tpupod-job.yaml"].mode == 0o644
    assert "job/__pycache__/x.pyc" not in members and "bootstrap/jobrun.py" in members
    assert "bootstrap/jobkit/tpupod_job/__init__.py" in members
    other = build_bundle(job=builtin_job.builtin("--config tiny"))
    assert other.sha256 != bundle.sha256  # the job is part of the bundle's hash


def test_the_builtin_trainer_is_a_job_of_the_same_format():
    job = builtin_job.builtin("--config small --steps 9 --set checkpoint_every=3")
    assert (
        job.spec.run == "exec python -m trainer --config small --steps 9 --set checkpoint_every=3"
    )
    assert job.spec.steps == 9 and job.spec.exit_codes.fatal == (2,)
    assert builtin_job.builtin("--config small").spec.steps == 50  # the preset's
    assert jobs.parse(job.files["tpupod-job.yaml"].decode(), "rendered") == job.spec


def test_a_stack_names_its_job_and_refuses_it_beside_the_builtins_keys():
    base = {"gcp:project": "p", "acceleratorType": "v4-8"}
    config = parse({**base, "job": "examples/jobs/flax-plain", "runId": "exp-2"}, stack="s")
    assert config.job_definition().spec.run.startswith("python train.py")
    assert config.run_id == "exp-2"
    with pytest.raises(ConfigError, match="tpupod:preset: shapes the built-in trainer"):
        parse({**base, "job": "examples/jobs/flax-plain", "preset": "small"}, stack="s")
    with pytest.raises(ConfigError, match=r"tpupod:job: .*no such job directory"):
        parse({**base, "job": "examples/jobs/nope"}, stack="s")
    with pytest.raises(ConfigError, match="tpupod:runId: the id 'Bad Id'"):
        parse({**base, "runId": "Bad Id"}, stack="s")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_job_check_and_local_up_refuse_a_bad_job_in_one_line(tmp_path):
    (tmp_path / "bad").mkdir()
    bad = make(tmp_path / "bad", "run: x\nsteps: -2\n")
    checked = cli("job", "check", str(bad))
    assert checked.returncode == 2
    assert checked.stderr.strip() == (f"tpupod: {bad / 'tpupod-job.yaml'}: key `steps`: Input "
                                      "should be greater than 0 (got -2)")  # fmt: skip
    pod_dir = tmp_path / "pod"
    up = cli("local", "up", "--job", str(bad), "--pod-dir", str(pod_dir))
    assert up.returncode == 2 and len(up.stderr.strip().splitlines()) == 1, up.stderr
    assert "key `steps`" in up.stderr and not pod_dir.exists()  # nothing started
    good = cli("job", "check", str(REPO / "examples" / "jobs" / "flax-plain"))
    assert good.returncode == 0 and "ok" in good.stdout and "regex" in good.stdout
    both = cli("local", "up", "--job", str(bad), "--preset", "tiny", "--pod-dir", str(pod_dir))
    assert both.returncode == 2 and "not with --job" in both.stderr
    preset = cli("local", "up", "--preset", "nope", "--pod-dir", str(pod_dir))
    assert preset.returncode == 2 and "--preset 'nope': unknown" in preset.stderr
    assert not pod_dir.exists()


def test_the_jobs_spec_travels_as_json():
    spec = builtin_job.builtin().spec
    assert json.loads(spec.to_json())["run"] == "exec python -m trainer --config tiny"


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "examples" / "jobs").iterdir()))
def test_every_example_job_is_valid_and_ships_what_it_runs(name):
    job = jobs.load(REPO / "examples" / "jobs" / name)
    assert job.spec.steps, "examples declare their steps (the done rule)"
    scripts = [w for w in job.spec.run.split() if w.endswith((".py", ".sh"))]
    assert scripts and all(s in job.files for s in scripts), (job.spec.run, sorted(job.files))
    if job.spec.python == "uv":
        assert {"pyproject.toml", "uv.lock"} <= set(job.files)
