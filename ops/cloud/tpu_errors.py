"""The Cloud TPU API's errors, judged by their body as Google returns them over REST.

google-api-core raises the HTTP code's base class over REST (TooManyRequests for every 429,
Conflict for every 409, BadRequest for every 400, Forbidden for a 403): the class alone cannot
tell quota from capacity, or a busy node from a bad request. Each class here is one kind of
answer recovery treats its own way (ops.watch.deadlines.ERROR_CLASSES): capacity is waited for,
quota backed off and named, permission and invalid requests stop recovery, the rest retried.
"""

from __future__ import annotations

import re

from google.api_core import exceptions as gexc

from ops.cloud.slice import ProviderError

# The TPU API's ways of saying "no capacity in this zone right now" (besides code 8).
STOCKOUT_MARKERS = ("no more capacity", "stockout", "insufficient capacity", "resource_exhausted")
RESOURCE_EXHAUSTED = 8
RETRIED_400S = {"FAILED_PRECONDITION", "OUT_OF_RANGE"}  # the state, not the request, is wrong
PERMISSION_HINT = (
    "the caller lacks {permission} on {name}: grant roles/tpu.admin (or tpu.nodes.get/list/"
    "create/delete and tpu.operations.get; queued resources need the same tpu.nodes.* "
    "permissions) and roles/iam.serviceAccountUser on the worker service account"
)
DISABLED_HINT = (
    "{service} is not enabled in the project: enable it (`gcloud services enable {service}`; the "
    "stack's ProjectServices does at `pulumi up`)"
)
QUOTA_HINT = "raise it under IAM & Admin > Quotas (filter: TPU)"
ZONE_HINT = " or list another zone in tpupod:zones"
REGION_HINT = "; another zone of the region cannot help"
# Google names the quota a create broke in the 429's message ("Quota limit 'A,B' has been
# exceeded. Limit: 0,0 in region R,zone Z.") and in a QuotaFailure violation per limit ("Quota
# 'A' exhausted. Limit 0 in region R"); its names say their scope (...PerRegion..., ...PerZone...).
QUOTA_NAMES = re.compile(r"Quota(?: limit)? '([^']+)'")
DEADLINE_EXCEEDED = 4  # a queued request's failedData.error when not filled in its window


class Stockout(ProviderError):
    """The zone has no capacity for the node now: retry later, it is nobody's failure."""


class Refused(ProviderError):
    """A request the TPU API will refuse however often it is sent: permission denied (403) or an
    invalid request (400). Recovery stops with the line that says what to fix."""


class QuotaExceeded(ProviderError):
    """The project's quota for this TPU is spent: a create is retried with backoff, but only
    more quota (or another zone, for a zone's quota) ends it, so the line names the quota.
    `regional`: a region's quota is among those spent (no zone of the region can help)."""

    def __init__(self, message: str, names: list[str], regional: bool) -> None:
        super().__init__(message)
        self.names, self.regional = names, regional


def quota_named(message: str, details: list | None = None, what: str = "") -> QuotaExceeded | None:
    """The quota a refusal or a FAILED request (of `what`) names, if any: Google's message and
    its QuotaFailure violations (or an ErrorInfo's metadata, as other Google APIs send)."""
    texts = [message]
    names: list[str] = []
    for detail in details or []:
        if not isinstance(detail, dict):
            continue
        meta = detail.get("metadata") or {}
        names += [meta[k] for k in ("quota_limit", "quota_metric") if meta.get(k)]
        violations = [v for v in detail.get("violations") or [] if isinstance(v, dict)]
        texts += [v.get("description", "") for v in violations]
    for text in texts:
        names += [n for group in QUOTA_NAMES.findall(text) for n in group.split(",")]
    names = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not names and "quota" not in message.lower():
        return None
    regional = any("PerRegion" in n for n in names) or " in region " in " ".join(texts)
    hint = QUOTA_HINT + (REGION_HINT if regional else ZONE_HINT)
    named = (f" for {what}" if what else "") + (f" ({', '.join(names)})" if names else "")
    return QuotaExceeded(f"quota exceeded{named}: {one_line_text(message)}; {hint}", names,
                         regional)  # fmt: skip


def refused(err: gexc.TooManyRequests, name: str) -> ProviderError:
    """A create refused with 429 / RESOURCE_EXHAUSTED. Over REST google-api-core raises
    TooManyRequests (not its subclass ResourceExhausted), for quota and capacity alike: only the
    body tells them apart (the quota named in the message or its details)."""
    try:
        details = err.response.json()["error"].get("details", [])
    except (AttributeError, KeyError, TypeError, ValueError):
        details = []
    message = one_line(err)
    quota = quota_named(message, details if isinstance(details, list) else [], name)
    return quota if quota is not None else Stockout(f"no capacity for {name}: {message}")


def failure_kind(code: int, message: str) -> str:
    """What a FAILED queued request's failedData.error (a google.rpc.Status) means for recovery:
    `quota` or `region-quota` (a quota named), `stockout` (no capacity, or not filled in its
    window: DEADLINE_EXCEEDED, or no error at all), or `other` (the request's own problem)."""
    quota = quota_named(message)
    if quota is not None:
        return "region-quota" if quota.regional else "quota"
    if not code or code == DEADLINE_EXCEEDED or is_stockout(code, message):
        return "stockout"
    return "other"


def is_stockout(code: int, message: str) -> bool:
    return code == RESOURCE_EXHAUSTED or any(m in message.lower() for m in STOCKOUT_MARKERS)


def judged(err: Exception, what: str, name: str, endpoint: str | None) -> Exception:
    """What a failed call means, as one exception: NotFound, AlreadyExists and a create's
    TooManyRequests as google-api-core raised them (the caller knows what they mean for its
    call), Refused, or a ProviderError to retry (a 429 on any other call is a rate limit)."""
    if isinstance(err, gexc.TooManyRequests) and "create" not in what:
        return ProviderError(f"TPU API {what} {name}: {one_line(err)}")  # a rate limit: later
    if isinstance(err, (gexc.NotFound, gexc.TooManyRequests, gexc.AlreadyExists)):
        return err
    if isinstance(err, gexc.Conflict) and already_exists(err):
        return gexc.AlreadyExists(err.message)  # over REST, ALREADY_EXISTS is a plain 409
    if isinstance(err, (gexc.Forbidden, gexc.BadRequest)):
        if status_of(err) in RETRIED_400S:  # a 400 a later try can pass (a node busy)
            return ProviderError(f"TPU API {what} {name}: {one_line(err)}")
        if isinstance(err, gexc.Forbidden):  # over REST a 403 is Forbidden, not its subclass
            return Refused(forbidden(err, name))
        return Refused(f"TPU API {what} {name} refused the request: {one_line(err)}; fix the "
                       "stack's node spec and deploy again")  # fmt: skip
    if isinstance(err, gexc.GoogleAPIError):
        return ProviderError(f"TPU API {what} {name}: {one_line(err)}")
    if isinstance(err, OSError):  # requests' ConnectionError is an OSError
        return ProviderError(f"TPU API at {endpoint or 'tpu.googleapis.com'} unreachable: "
                             f"{one_line(err)}")  # fmt: skip
    return err


def error_info(err: gexc.GoogleAPICallError) -> dict:
    """The body's google.rpc.ErrorInfo ({} when it has none). Over REST google-api-core keeps it
    as a dict, and its `reason`/`metadata` properties fail on one: read the body instead."""
    try:
        details = err.response.json()["error"].get("details") or []
    except (AttributeError, KeyError, TypeError, ValueError):
        return {}
    return next((d for d in details if str(d.get("@type", "")).endswith("rpc.ErrorInfo")), {})


def forbidden(err: gexc.GoogleAPICallError, name: str) -> str:
    """What a 403 says to fix: the API to enable, or the permission the caller lacks."""
    info = error_info(err)
    meta = info.get("metadata") or {}
    if info.get("reason") == "SERVICE_DISABLED":
        return DISABLED_HINT.format(service=meta.get("service", "tpu.googleapis.com"))
    permission = meta.get("permission") or "a TPU API permission"
    return PERMISSION_HINT.format(permission=permission, name=meta.get("resource") or name)


def status_of(err: gexc.GoogleAPICallError) -> str | None:
    """The error's canonical status: gRPC names it in the class, REST only in the body (over
    REST google-api-core raises the HTTP code's base class: Conflict for ALREADY_EXISTS,
    BadRequest for FAILED_PRECONDITION, Forbidden for PERMISSION_DENIED)."""
    try:
        return err.response.json()["error"]["status"]
    except (AttributeError, KeyError, TypeError, ValueError):
        code = getattr(err, "grpc_status_code", None)
        return code.name if code is not None else None


def already_exists(err: gexc.Conflict) -> bool:
    """A 409 that means ALREADY_EXISTS (not ABORTED)."""
    if isinstance(err, gexc.AlreadyExists):
        return True
    status = status_of(err)
    return status == "ALREADY_EXISTS" if status else "already exists" in str(err.message).lower()


def one_line(err: BaseException) -> str:
    return one_line_text(getattr(err, "message", None) or str(err) or type(err).__name__)


def one_line_text(text: object) -> str:
    return " ".join(str(text).split())[:300]
