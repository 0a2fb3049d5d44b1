"""The built-in trainer as infra knows it: a job like any other (`trainer/tpupod-job.yaml`),
rendered for a stack's preset, steps and trainer arguments. infra imports nothing of trainer:
the preset names and the steps each trains to are data the built-in job ships
(`trainer/presets.json`, kept equal to trainer.config.PRESETS by a test)."""

from __future__ import annotations

import json
import shlex
from functools import cache
from pathlib import Path

import yaml

from contract import runline
from contract.job import JOB_FILE, Job, parse

TRAINER_DIR = Path(__file__).resolve().parent.parent / "trainer"
BUILTIN_FILE = TRAINER_DIR / JOB_FILE
PRESETS_FILE = TRAINER_DIR / "presets.json"
BUILTIN_RUN = "exec python -m trainer"  # the built-in trainer's run line, before its arguments


@cache
def preset_steps() -> dict[str, int]:
    """Preset name -> the steps it trains to, as the built-in job ships them."""
    return json.loads(PRESETS_FILE.read_text())["steps"]


def builtin(trainer_args: str = "--config tiny") -> Job:
    """The built-in trainer's job (`trainer/tpupod-job.yaml`) with `python -m trainer ARGS` as
    its run; `steps` is what the trainer will train to, for progress and the done rule."""
    template = yaml.safe_load(BUILTIN_FILE.read_text())
    args = trainer_args.strip()
    template["run"] = f"{BUILTIN_RUN} {args}".strip()
    template["steps"] = builtin_steps(args)
    try:
        runline.parse(template["run"])
    except runline.NotStandby:  # arguments that need a shell: the restarts run cold
        template.pop("standby", None)
    text = yaml.safe_dump(template, sort_keys=False)
    spec = parse(text, f"{BUILTIN_FILE} (rendered for `{args}`)")
    return Job(spec=spec, files={JOB_FILE: text.encode()}, source=f"built-in trainer ({args})")


def builtin_args(run: str) -> str | None:
    """The trainer arguments of a built-in trainer's `run` line; None for any other program."""
    words, head = shlex.split(run), shlex.split(BUILTIN_RUN)
    return " ".join(words[len(head) :]) if words[: len(head)] == head else None


def builtin_steps(trainer_args: str) -> int | None:
    """The steps `python -m trainer ARGS` trains to: --steps, else the preset's (None: a YAML
    config, whose steps only the trainer reads)."""
    words = shlex.split(trainer_args)
    value = _flag(words, "--steps")
    if value is not None:
        return int(value) if value.isdigit() and int(value) > 0 else None
    return preset_steps().get(_flag(words, "--config") or "")


def _flag(words: list[str], name: str) -> str | None:
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None
