"""A job: a directory with `tpupod-job.yaml` that every worker runs (the worker -> job seam).

Validated once, where the operator is (`tpupod job check`, the Pulumi program, `tpupod local up`):
a bad key is one line naming the key and the file. Workers never parse YAML: the spec travels as
JSON in the node's metadata (`tpupod-job`) and the directory inside the code bundle (`job/`).
The built-in trainer is a job of the same format (`trainer/tpupod-job.yaml`), rendered for a
preset by `infra.builtin_job.builtin()`, so there is one path for every program.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contract import runline
from contract.exit_codes import EXIT_BAD_INPUT, EXIT_PREEMPTED
from contract.standby_spec import StandbySpec

JOB_FILE = "tpupod-job.yaml"
# Never shipped: caches, environments and VCS state a job directory often holds.
SKIP_PARTS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache",
              ".ruff_cache", ".tpupod", ".ipynb_checkpoints", "node_modules"}  # fmt: skip
SKIP_SUFFIXES = {".pyc", ".pyo"}
MAX_BYTES = 64 * 1024 * 1024  # the bundle goes to every worker at every recreate
_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_ID = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
# The contract's own variables (docs/seams.md): a job's `env` cannot replace them.
RESERVED_ENV = ("JAX_COORDINATOR_ADDRESS", "PATH")
PYTHON_FILES = {"uv": ("pyproject.toml", "uv.lock"), "requirements": ("requirements.txt",),
                "none": ()}  # fmt: skip


class JobError(ValueError):
    """A job that cannot run: `str()` is the whole one-line message (file, key, fix)."""


class ExitCodes(BaseModel):
    """Exit codes with a meaning beyond "crash". 0 is judged by the done rule (docs: README)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preempted: tuple[int, ...] = (EXIT_PREEMPTED,)  # restart, not charged to max_restarts
    fatal: tuple[int, ...] = (
        EXIT_BAD_INPUT,
    )  # stop recovery: usage errors do not heal by restarting

    @field_validator("preempted", "fatal", mode="before")
    @classmethod
    def _codes(cls, value: Any) -> Any:
        codes = [value] if isinstance(value, int) else list(value or ())
        for code in codes:
            if not isinstance(code, int) or isinstance(code, bool) or not 1 <= code <= 255:
                raise ValueError(f"{code!r} is not an exit code from 1 to 255 (0 means done)")
        return tuple(codes)

    @model_validator(mode="after")
    def _apart(self) -> ExitCodes:
        if both := sorted(set(self.preempted) & set(self.fatal)):
            raise ValueError(f"code {both[0]} is both preempted and fatal")
        return self


class RegexProgress(BaseModel):
    """Progress read from the job's output: the last match's first group is the step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    regex: str

    @field_validator("regex")
    @classmethod
    def _one_group(cls, value: str) -> str:
        try:
            pattern = re.compile(value)
        except re.error as err:
            raise ValueError(f"{value!r} is not a regular expression ({err})") from None
        if pattern.groups < 1:
            raise ValueError(f"{value!r} needs a group that captures the step, e.g. 'step (\\d+)'")
        return value


class JobSpec(BaseModel):
    """`tpupod-job.yaml`. Seconds left None take `tpupod watch`'s defaults for the provider."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    python: Literal["none", "uv", "requirements"] = "none"
    steps: int | None = Field(default=None, gt=0)
    secrets: dict[str, str] = Field(default_factory=dict)  # variable -> Secret Manager id
    startup_timeout_s: float | None = Field(default=None, gt=0)
    hang_after_s: float | None = Field(default=None, gt=0)
    # What a hang's forensics keep before its restart: every thread's Python stack with its
    # locals (py-spy, milliseconds a process), or those and the native frames too (XLA,
    # libtpu, a collective: py-spy --native reads every library's symbols, ~0.6 s a process on
    # the local pod's 2 cores, and every such second is the whole slice's, idle).
    hang_stacks: Literal["python", "native"] = "python"
    max_restarts: int = Field(default=3, ge=0)
    backoff_s: float = Field(default=2.0, gt=0)
    progress: Literal["status", "none"] | RegexProgress = "status"
    exit_codes: ExitCodes = Field(default_factory=ExitCodes)
    grace_s: int = Field(default=60, gt=0)  # whole seconds: systemd's and jobctl's unit
    # A preemption may come with no notice (GCP gives none on maintenance): the job saves at
    # least this often, so such a kill costs at most this much work (TPUPOD_MAX_LOSS_S).
    max_loss_minutes: float = Field(default=5.0, gt=0)
    standby: StandbySpec | None = None

    @field_validator("run")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is empty; give the command every worker runs, e.g. python train.py")
        return value.strip()

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        for name in value:
            if not _ENV_NAME.match(str(name)):
                raise ValueError(f"{name!r} is not an environment variable name")
            if str(name) in RESERVED_ENV or str(name).startswith("TPUPOD_"):
                raise ValueError(f"{name} is set by tpupod (the job contract); choose another name")
        return {str(k): "" if v is None else str(v) for k, v in value.items()}

    @field_validator("secrets", mode="before")
    @classmethod
    def _secrets(cls, value: Any) -> Any:
        """A list of names (variable = secret id) or a mapping variable -> secret id."""
        if value is None:
            return {}
        pairs = {str(n): str(n) for n in value} if isinstance(value, list) else value
        if not isinstance(pairs, dict):
            raise ValueError("give a list of secret names or a mapping VARIABLE: secret-id")
        for var, secret in pairs.items():
            if not _ENV_NAME.match(str(var)) or str(var).startswith("TPUPOD_"):
                raise ValueError(f"{var!r} cannot be an environment variable of the job")
            if not SECRET_ID.match(str(secret)):
                raise ValueError(f"{secret!r} is not a Secret Manager secret id")
        return {str(k): str(v) for k, v in pairs.items()}

    @model_validator(mode="after")
    def _no_secret_in_env(self) -> JobSpec:
        if clash := sorted(set(self.env) & set(self.secrets)):
            raise ValueError(f"{clash[0]} is both in env and in secrets")
        return self

    @model_validator(mode="after")
    def _standby_runs_this_line(self) -> JobSpec:
        """A standby imports before the job starts: never with secrets (any import could read
        one), and only for a run line it can run in-process as bash would (contract.runline)."""
        if self.standby is None:
            return self
        if self.secrets:
            raise ValueError("standby: a job with secrets cannot have one (its imports would "
                             "run before the secrets are read); remove one of the two")  # fmt: skip
        try:
            runline.parse(self.run)
        except runline.NotStandby as err:
            raise ValueError(f"standby: {err}; write run as `exec python -m MODULE ARGS`") from None
        return self

    @property
    def progress_regex(self) -> str | None:
        return self.progress.regex if isinstance(self.progress, RegexProgress) else None

    def to_json(self) -> str:
        """Compact JSON, as the `tpupod-job` metadata value (and what workers read)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Job:
    """A validated job: its spec and its directory's files as they ship in the bundle."""

    spec: JobSpec
    files: dict[str, bytes]  # relative path -> content
    source: str  # where it came from, for messages
    executables: frozenset[str] = frozenset()  # the files that keep their x bit

    @property
    def size(self) -> int:
        return sum(len(data) for data in self.files.values())


def check_run_id(value: str, where: str = "run id") -> str:
    """A run id names the run's directory (gs://BUCKET/runs/<stack>/<run id>)."""
    if not _RUN_ID.match(value or ""):
        raise JobError(
            f"{where} {value!r}: use 1-63 lowercase letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (e.g. 2026-11-25a)"
        )
    return value


def new_run_id(now: float | None = None) -> str:
    """A fresh run id from the UTC time, e.g. 20261125-163012-3f2a."""
    import secrets
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    return f"{stamp}-{secrets.token_hex(2)}"


def spec_from_json(text: str) -> JobSpec:
    """The spec as metadata carries it (watch and the local pod read it back)."""
    return JobSpec.model_validate(json.loads(text))


def parse(text: str, where: str) -> JobSpec:
    """A `tpupod-job.yaml`'s text -> its spec, or one JobError line naming the key and `where`."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise JobError(f"{where}: not YAML{at}: {getattr(err, 'problem', err)}") from None
    if not isinstance(raw, dict):
        raise JobError(f"{where}: expected a mapping with at least `run: COMMAND`")
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as err:
        raise JobError(f"{where}: {_first_problem(err)}") from None


def _first_problem(error: ValidationError) -> str:
    errors = error.errors()
    first = errors[0]
    if first["loc"][:1] == ("progress",):  # a union: the regex's own complaint, else the forms
        inner = [e for e in errors if "regex" in e["loc"] and e["type"] == "value_error"]
        if not inner:
            return "key `progress`: use `status`, `none` or `{regex: 'step (\\d+)'}`"
        first = inner[0]
    key = ".".join(str(p) for p in first["loc"] if str(p) not in ("RegexProgress",)
                   and not str(p).startswith(("function-", "literal")))  # fmt: skip
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        known = ", ".join(JobSpec.model_fields)
        return f"key `{key}`: unknown key; known keys: {known}"
    if first["type"] == "missing":
        return f"key `{key}` is required" + (
            ": the command every worker runs" if key == "run" else ""
        )
    got = first.get("input")
    shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
    return f"key `{key or 'progress'}`: {message}{shown}"


def load(directory: str | Path) -> Job:
    """A job directory, checked: its spec, its Python files, its size. JobError otherwise."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise JobError(f"{directory}: no such job directory")
    job_file = root / JOB_FILE
    if not job_file.is_file():
        raise JobError(
            f"{root}: no {JOB_FILE} (a job is a directory with {JOB_FILE}, `run:` at least)"
        )
    spec = parse(job_file.read_text(), str(job_file))
    for name in PYTHON_FILES[spec.python]:
        if not (root / name).is_file():
            raise JobError(f"{job_file}: key `python: {spec.python}` needs {name} beside it")
    files = _read_files(root)
    executables = frozenset(n for n in files if (root / n).stat().st_mode & 0o111)
    job = Job(spec=spec, files=files, source=str(root.resolve()), executables=executables)
    if job.size > MAX_BYTES:
        raise JobError(
            f"{root}: {job.size / 2**20:.0f} MiB to ship to every worker (at most "
            f"{MAX_BYTES // 2**20} MiB); keep data and checkpoints in the bucket, not the job"
        )
    return job


def _read_files(root: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if SKIP_PARTS.intersection(rel.parts) or path.suffix in SKIP_SUFFIXES:
            continue
        if path.is_file():
            files[rel.as_posix()] = path.read_bytes()
    return files
