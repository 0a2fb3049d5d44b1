"""A create refused with HTTP 429, as google-api-core raises it over REST (TooManyRequests, not
ResourceExhausted): quota when the body names one, capacity otherwise."""

from __future__ import annotations

import json

import requests
from google.api_core import exceptions as gexc

from ops.tpu import QuotaExceeded, Stockout, refused


def _429(message: str, details: list | None = None) -> gexc.GoogleAPICallError:
    response = requests.Response()
    response.status_code = 429
    error = {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": message}
    response._content = json.dumps({"error": {**error, "details": details or []}}).encode()
    response.request = requests.Request("POST", "https://tpu.googleapis.com/v2/x").prepare()
    return gexc.from_http_response(response)


def test_a_429_is_too_many_requests_and_not_resource_exhausted():
    err = _429("There is no more capacity in the zone")
    assert isinstance(err, gexc.TooManyRequests) and not isinstance(err, gexc.ResourceExhausted)


def test_quota_named_in_error_info_or_message_is_quota():
    info = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
             "metadata": {"quota_limit": "TPUV6EPreemptiblePerProjectPerRegion"}}]  # fmt: skip
    by_info = refused(_429("Resource exhausted.", info), "v6e-8")
    assert isinstance(by_info, QuotaExceeded) and "TPUV6EPreemptiblePerProjectPerRegion" in str(
        by_info
    )
    by_text = refused(_429("Quota limit 'X' has been exceeded. Limit: 0 in zone z."), "v6e-8")
    assert isinstance(by_text, QuotaExceeded) and "IAM & Admin > Quotas" in str(by_text)


def test_a_429_for_capacity_is_a_stockout():
    found = refused(_429('There is no more capacity in the zone "us-east5-a"'), "v5p")
    assert isinstance(found, Stockout) and not isinstance(found, QuotaExceeded)
