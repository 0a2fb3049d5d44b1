"""Compute Engine's refusals as recovery judges them: its error codes (on an operation or a VM's
last attempt) and the `reason` of a 400/403 body, read from Google's envelope."""

from __future__ import annotations

from google.api_core import exceptions as gexc

from ops.cloud.tpu_errors import RESOURCE_EXHAUSTED

# 400/403 reasons a later try can pass: a resource busy with another operation, rate limits.
RETRIED_REASONS = ("resourceNotReady", "rateLimitExceeded", "userRateLimitExceeded",
                   "backendError")  # fmt: skip
STOCKOUT_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
INTERNAL = 13


def reason_of(err: gexc.GoogleAPICallError) -> str:
    """Compute Engine's own reason for a refusal (`error.errors[0].reason`), "" when none."""
    try:
        return str(err.response.json()["error"]["errors"][0]["reason"])
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return ""


def rpc_code(code: str) -> int:
    """A Compute Engine error code as the google.rpc code recovery judges by."""
    return RESOURCE_EXHAUSTED if code in STOCKOUT_CODES else INTERNAL
