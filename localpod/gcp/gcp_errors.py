"""Google's error answers, as its front ends shape them, for every API of the local cloud.

Two envelopes (research: docs/seams.md, "Google's error bodies"):
- google.rpc (Cloud TPU, Secret Manager, OS Login): `{"error": {code, message, status, details}}`
  with ErrorInfo reasons CREDENTIALS_MISSING / ACCESS_TOKEN_EXPIRED / ACCESS_TOKEN_TYPE_UNSUPPORTED
  (401), SERVICE_DISABLED and IAM_PERMISSION_DENIED (403);
- Cloud Storage's JSON API: `{"error": {code, message, errors: [{domain, reason, message}]}}` with
  reasons `required` / `authError` (401), `forbidden` and `accessNotConfigured` (403).
"""

from __future__ import annotations

# google.rpc.Code names -> HTTP status, as Google's REST front end maps them.
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
INVALID_CREDENTIALS = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie "
    "or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)
MISSING_CREDENTIALS = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, login "
    "cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)
TOKEN_REASONS = {
    "missing": "CREDENTIALS_MISSING",
    "expired": "ACCESS_TOKEN_EXPIRED",
    "invalid": "ACCESS_TOKEN_TYPE_UNSUPPORTED",
}
# Service -> the title Google's console and its SERVICE_DISABLED answers give it.
SERVICE_TITLES = {
    "tpu.googleapis.com": "Cloud TPU API",
    "storage.googleapis.com": "Cloud Storage API",
    "secretmanager.googleapis.com": "Secret Manager API",
    "oslogin.googleapis.com": "Cloud OS Login API",
    "compute.googleapis.com": "Compute Engine API",
}


class ApiError(Exception):
    """A google.rpc status answer (Cloud TPU, Secret Manager, OS Login)."""

    def __init__(self, status: str, message: str, details: list | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.details = status, message, details or []

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.status]

    def body(self) -> dict:
        error = {"code": self.http_status, "message": self.message, "status": self.status}
        return {"error": {**error, "details": self.details} if self.details else error}


def activation_url(service: str, project: str) -> str:
    return f"https://console.developers.google.com/apis/api/{service}/overview?project={project}"


def disabled_message(service: str, project: str) -> str:
    """Worded exactly as Google words it: gcloud matches it to offer enabling the API."""
    title = SERVICE_TITLES.get(service, service)
    return (
        f"{title} has not been used in project {project} before or it is disabled. Enable it by "
        f"visiting {activation_url(service, project)} then retry. If you enabled this API "
        "recently, wait a few minutes for the action to propagate to our systems and retry."
    )


def unauthenticated(problem: str, service: str, rpc: str) -> ApiError:
    """401: `problem` is "missing", "expired" or "invalid" (tokens.verify's answer)."""
    message = MISSING_CREDENTIALS if problem == "missing" else INVALID_CREDENTIALS
    info = {"@type": ERROR_INFO, "reason": TOKEN_REASONS[problem],
            "metadata": {"service": service, "method": rpc}}  # fmt: skip
    if problem != "invalid":  # Google's ACCESS_TOKEN_TYPE_UNSUPPORTED carries no domain
        info["domain"] = "googleapis.com"
    return ApiError("UNAUTHENTICATED", message, [info])


def service_disabled(service: str, project: str) -> ApiError:
    message = disabled_message(service, project)
    url = activation_url(service, project)
    return ApiError("PERMISSION_DENIED", message, [
        {"@type": ERROR_INFO, "reason": "SERVICE_DISABLED", "domain": "googleapis.com",
         "metadata": {"activationUrl": url, "containerInfo": project,
                      "consumer": f"projects/{project}", "service": service,
                      "serviceTitle": SERVICE_TITLES.get(service, service)}},
        {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US",
         "message": message},
        {"@type": "type.googleapis.com/google.rpc.Help",
         "links": [{"description": "Google developers console API activation", "url": url}]},
    ])  # fmt: skip


def permission_denied(service: str, permission: str, resource: str) -> ApiError:
    """IAM said no: the permission and the resource named as Google names them (the full name
    in the message, the relative one in the ErrorInfo)."""
    return ApiError(
        "PERMISSION_DENIED",
        f"Permission '{permission}' denied on resource '//{service}/{resource}' "
        "(or it may not exist).",
        [{"@type": ERROR_INFO, "reason": "IAM_PERMISSION_DENIED", "domain": service,
          "metadata": {"permission": permission, "resource": resource}}],
    )  # fmt: skip


# -- Cloud Storage's JSON API ----------------------------------------------------------------------
def _gcs(code: int, message: str, reason: str, domain: str = "global", **more) -> dict:
    entry = {"domain": domain, "reason": reason, "message": message, **more}
    return {"error": {"code": code, "message": message, "errors": [entry]}}


def gcs_unauthenticated(problem: str, permission: str, kind: str) -> tuple[int, dict]:
    """No token: 401 `required` naming the permission; a bad one: 401 `authError`."""
    header = {"locationType": "header", "location": "Authorization"}
    if problem == "missing":
        message = (f"Anonymous caller does not have {permission} access to the Google Cloud "
                   f"Storage {kind}. Permission '{permission}' denied on resource (or it may "
                   "not exist).")  # fmt: skip
        return 401, _gcs(401, message, "required", **header)
    return 401, _gcs(401, "Invalid Credentials", "authError", **header)


def gcs_forbidden(caller: str, permission: str, kind: str) -> tuple[int, dict]:
    message = (f"{caller} does not have {permission} access to the Google Cloud Storage {kind}. "
               f"Permission '{permission}' denied on resource (or it may not exist).")  # fmt: skip
    return 403, _gcs(403, message, "forbidden")


def gcs_disabled(project: str) -> tuple[int, dict]:
    service = "storage.googleapis.com"
    return 403, _gcs(
        403,
        disabled_message(service, project),
        "accessNotConfigured",
        domain="usageLimits",
        extendedHelp="https://console.developers.google.com",
    )
