"""`tpupod:data`: prepared data named in the stack's bucket (workers get read-only `data/`) or
anywhere on GCS (no grant here; README says what to grant there), handed to the trainer through
the built-in trainer's job (`tpupod-job`: its run). Evaluated offline under Pulumi mocks."""

from __future__ import annotations

import json

import pytest

from contract import metadata
from infra import naming, offline, policies
from infra.config import parse
from infra.config_checks import ConfigError
from infra.identity import READ_ONLY

GRANT = "gcp:storage/bucketIAMMember:BucketIAMMember"
BASE = {"gcp:project": "p", "acceleratorType": "v4-8"}


def test_a_name_is_under_the_stack_buckets_data_prefix():
    config = parse({**BASE, "data": "corpus-bpe"}, stack="s")
    uri = f"gs://{naming.bucket_name(config)}/data/corpus-bpe"
    assert config.data_uri == uri and config.data_in_stack_bucket
    assert config.trainer_command_args == f"--config tiny --set data={uri}"
    same = parse({**BASE, "data": f"{uri}/"}, stack="s")
    assert same.data_uri == uri and same.data_in_stack_bucket


def test_another_bucket_is_passed_through_without_a_grant():
    config = parse({**BASE, "data": "gs://shared-corpora/web/bpe-32k", "steps": "9"}, stack="s")
    assert config.data_uri == "gs://shared-corpora/web/bpe-32k" and not config.data_in_stack_bucket
    assert (
        config.trainer_command_args
        == "--config tiny --steps 9 --set data=gs://shared-corpora/web/bpe-32k"
    )
    assert parse(BASE, stack="s").trainer_command_args == "--config tiny"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/home/me/data", "neither a name under the stack bucket's data/ prefix"),
        ("gs://", "neither a name"),
        ("gs://Bad_Bucket/x", "not a valid bucket name"),
        ("gs://bucket-only", "neither a name"),
        ("../runs/x", "neither a name"),
        ("two words", "neither a name"),
        ("gs://p-tpupod-s/runs/s/x", "outside data/"),
    ],
)
def test_bad_data_values_are_one_line_naming_the_key(value, expected):
    with pytest.raises(ConfigError) as err:
        parse({**BASE, "data": value}, stack="s")
    assert str(err.value).startswith("tpupod:data: ") and expected in str(err.value)
    assert "\n" not in str(err.value)


def _evaluate(data: str) -> offline.Evaluation:
    return offline.evaluate("v4-8", {**offline.stack_config("v4-8"), "tpupod:data": data})


def test_workers_read_the_stacks_data_prefix_only():
    evaluation = _evaluate("corpus-bpe")
    grants = {r.name: r.inputs for r in evaluation.of_type(GRANT)}
    data = grants["workers-bucket-data"]
    bucket = evaluation.one("gcp:storage/bucket:Bucket").inputs["name"]
    expression = data["condition"]["expression"]
    assert data["role"] == READ_ONLY == "roles/storage.objectViewer"
    assert f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/data/")' in expression
    args = _run(evaluation)
    assert f"--set data=gs://{bucket}/data/corpus-bpe" in args
    resources = [(r.type, r.inputs, r.protect) for r in evaluation.resources]
    found = [v for t, i, p in resources for v in policies.violations(t, i, p)]
    assert found + policies.stack_violations((t, i) for t, i, _ in resources) == []


def test_data_elsewhere_adds_no_grant_on_the_stack_bucket():
    evaluation = _evaluate("gs://shared-corpora/web/bpe-32k")
    assert "workers-bucket-data" not in {r.name for r in evaluation.of_type(GRANT)}
    assert _run(evaluation).endswith("--set data=gs://shared-corpora/web/bpe-32k")


def _run(evaluation: offline.Evaluation) -> str:
    """The built-in job's command line, as the node's metadata carries it."""
    return json.loads(evaluation.one("gcp:tpu/v2Vm:V2Vm").inputs["metadata"][metadata.JOB])["run"]
