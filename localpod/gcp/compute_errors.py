"""Compute Engine v1's error answers, in its own envelope (not google.rpc's):
`{"error": {"code", "message", "errors": [{"message", "domain", "reason"}]}}`, as its REST front
end sends them and google-cloud-compute / gcloud read them (reasons: notFound, alreadyExists,
invalid, resourceNotReady, forbidden, required, accessNotConfigured)."""

from __future__ import annotations

from localpod.gcp import gcp_errors
from localpod.gcp.authz import Denied


class ComputeError(Exception):
    """One Compute Engine refusal; `reply_error` of the loopback handler sends it."""

    def __init__(self, http_status: int, reason: str, message: str,
                 domain: str = "global", details: list | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.http_status, self.reason, self.message = http_status, reason, message
        self.domain, self.details = domain, details or []

    def body(self) -> dict:
        entry = {"message": self.message, "domain": self.domain, "reason": self.reason}
        error = {"code": self.http_status, "message": self.message, "errors": [entry]}
        if self.details:
            error["details"] = self.details
        return {"error": error}


def not_found(name: str) -> ComputeError:
    return ComputeError(404, "notFound", f"The resource '{name}' was not found")


def already_exists(name: str) -> ComputeError:
    return ComputeError(409, "alreadyExists", f"The resource '{name}' already exists")


def invalid(message: str) -> ComputeError:
    return ComputeError(400, "invalid", message)


def not_ready(name: str, why: str) -> ComputeError:
    return ComputeError(400, "resourceNotReady", f"The resource '{name}' is not ready: {why}")


def refusal(denied: Denied, project: str) -> ComputeError:
    """The gate's refusal as Compute Engine words it."""
    if denied.kind == "unauthenticated":
        message = (gcp_errors.MISSING_CREDENTIALS if denied.caller.problem == "missing"
                   else gcp_errors.INVALID_CREDENTIALS)  # fmt: skip
        reason = "required" if denied.caller.problem == "missing" else "authError"
        return ComputeError(401, reason, message)
    if denied.kind == "disabled":
        rpc = gcp_errors.service_disabled(denied.service, project)
        return ComputeError(403, "accessNotConfigured", rpc.message, domain="usageLimits",
                            details=rpc.details)  # fmt: skip
    target = denied.target
    return ComputeError(
        403, "forbidden", f"Required '{target.permission}' permission for '{target.name}'"
    )
