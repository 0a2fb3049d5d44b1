"""What the installed google-cloud-tpu makes of an enum value it lacks, parsed as its REST
transport parses an answer (unknown fields ignored), and that ops.cloud.tpu_fields reads each without
raising: a newer name arrives as *_UNSPECIFIED, a newer number as a bare int whose enum class
raises ValueError (the watcher exited 1 on it, issue 48)."""

from __future__ import annotations

import pytest
from google.cloud import tpu_v2
from google.protobuf import json_format

from ops.cloud.queued import UNRECOGNIZED, status_of
from ops.cloud.tpu_fields import CLIENT, enum_name, unnamed


def _as_rest_reads(message_type, body: str):
    message = message_type()
    json_format.Parse(body, message._pb, ignore_unknown_fields=True)
    return message


def test_the_client_reads_a_new_name_as_unspecified_and_a_new_number_as_an_int():
    named = _as_rest_reads(tpu_v2.Node, '{"state": "NEWSTATE"}')
    assert named.state == tpu_v2.Node.State.STATE_UNSPECIFIED
    numbered = _as_rest_reads(tpu_v2.Node, '{"state": 99}')
    with pytest.warns(UserWarning):
        assert numbered.state == 99 and type(numbered.state) is int
    with pytest.raises(ValueError):  # what ops.cloud.tpu did with it: the negative control
        tpu_v2.Node.State(99)


@pytest.mark.parametrize("body", ['{"state": "NEWSTATE"}', '{"state": 99}'])
def test_a_value_the_client_cannot_name_has_no_name_and_says_why(body):
    node = _as_rest_reads(tpu_v2.Node, body)
    assert enum_name(tpu_v2.Node.State, node.state) is None
    assert CLIENT in unnamed("state", node.state)
    assert enum_name(tpu_v2.Node.State, tpu_v2.Node.State.UNKNOWN) == "UNKNOWN"  # Google's own


@pytest.mark.parametrize("state", ['"NEWSTATE"', "99"])
def test_a_queued_resource_in_a_state_the_client_cannot_name_is_unrecognized(state):
    request = _as_rest_reads(tpu_v2.QueuedResource, f'{{"state": {{"state": {state}}}}}')
    status = status_of(request)
    assert status.state == UNRECOGNIZED and CLIENT in status.detail


def test_a_failed_requests_error_is_named_by_its_code():
    body = '{"state": {"state": "FAILED", "failedData": {"error": {"code": 3, "message": "bad"}}}}'
    status = status_of(_as_rest_reads(tpu_v2.QueuedResource, body))
    assert (status.state, status.code, status.detail) == ("FAILED", 3, "INVALID_ARGUMENT (3): bad")
