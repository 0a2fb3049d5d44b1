"""infra reads the built-in job's preset names and steps from `trainer/presets.json` (it imports
nothing of trainer); the file must say what trainer.config.PRESETS says."""

from __future__ import annotations

import json

from infra.builtin_job import PRESETS_FILE, builtin_steps
from trainer.config import PRESETS, Config


def shipped() -> dict[str, int]:
    return json.loads(PRESETS_FILE.read_text())["steps"]


def test_the_presets_file_says_what_the_trainer_trains_to():
    expected = {name: preset.get("steps", Config.steps) for name, preset in PRESETS.items()}
    assert shipped() == expected, (
        "trainer/presets.json is stale: rewrite its `steps` from trainer.config.PRESETS"
    )


def test_infra_reads_steps_from_the_file():
    assert builtin_steps("--config small") == shipped()["small"]
    assert builtin_steps("--config small --steps 7") == 7
    assert builtin_steps("--config my.yaml") is None
