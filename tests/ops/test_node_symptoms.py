"""What the TPU API reports going wrong on a node (its `symptoms`) reaches the slice's detail:
the incident's reason and `tpupod status` name it."""

from __future__ import annotations

from google.cloud import tpu_v2

from ops.cloud.tpu import symptoms


def test_symptoms_are_named_with_their_worker_and_details():
    node = tpu_v2.Node(symptoms=[
        tpu_v2.Symptom(symptom_type=tpu_v2.Symptom.SymptomType.OUT_OF_MEMORY, worker_id="1",
                       details="host OOM"),
        tpu_v2.Symptom(symptom_type=tpu_v2.Symptom.SymptomType.MESH_BUILD_FAIL),
    ])  # fmt: skip
    assert symptoms(node) == ["OUT_OF_MEMORY on worker 1 (host OOM)",
                              "MESH_BUILD_FAIL on worker ?"]  # fmt: skip
    assert symptoms(tpu_v2.Node()) == []
