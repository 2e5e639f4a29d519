"""The E2B wire table: what each leaf of the error tree (``sandhold.errors``) becomes on the E2B
surface. Every answer is a JSON ``{code, message}`` body, because the official SDK parses error
bodies with ``Error.from_dict(response.json())``, and ``code`` is the HTTP status, as E2B's."""

from __future__ import annotations

from starlette.responses import JSONResponse

from sandhold import errors as e
from sandhold.errors import SandholdError, lookup

# Never 503 for what will not get better by itself: the SDK retries that status, which only
# delays a failure that will repeat (a missing kernel feature, a failed start).
E2B_STATUS: dict[type[SandholdError], int] = {
    e.SandholdError: 500,
    e.InvalidRequest: 400,
    e.ConfigError: 400,
    e.Unauthenticated: 401,
    e.Forbidden: 403,
    e.ViewDenied: 403,
    e.EgressRefused: 403,
    e.NotFound: 404,
    e.SandboxNotFound: 404,
    e.TemplateNotFound: 404,
    e.VolumeNotFound: 404,
    e.SessionNotFound: 404,
    e.Conflict: 409,
    e.SessionClosed: 409,
    e.NeedsNewSandbox: 409,
    e.IdempotencyMismatch: 422,
    e.PreconditionFailed: 412,
    e.PayloadTooLarge: 413,
    e.QuotaExceeded: 429,
    e.Unsupported: 400,  # E2B answers an unsupported option with 400 and a message
    e.Unavailable: 500,
    e.HostUnsupported: 500,
    e.SessionBusy: 500,
    e.LockLost: 500,
    e.EgressUnavailable: 500,
    # E2B's own answer to a strict pause (requireHealthyGuest) of an unresponsive guest: the
    # SDK raises ServiceBusyException (after its retries, each one checked again).
    e.GuestUnresponsive: 503,
    e.HostUnavailable: 503,
    e.SandboxStartFailed: 500,
    e.TemplateBuildFailed: 500,
    e.CheckpointFailed: 500,
    e.SecretKeyError: 500,
    e.EnvdError: 502,
    e.PortClosed: 502,
    e.ProviderError: 502,
    e.SandboxGone: 502,
}


def e2b_status(err: SandholdError) -> int:
    return lookup(E2B_STATUS, err)


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def answer(err: SandholdError) -> JSONResponse:
    return error_response(e2b_status(err), err.message)
