"""Errors of the gateway surface; each has a stable code and HTTP status (see sandhold.errors)."""

from __future__ import annotations

from sandhold.errors import Conflict, NotFound, SandholdError


class Unauthorized(SandholdError):
    code = "unauthorized"
    http_status = 401


class SessionNotFound(NotFound):
    pass


class SessionClosed(Conflict):
    code = "session_closed"


class SessionBusy(SandholdError):
    """The session's lock stayed taken (another replica is creating or reclaiming its sandbox)."""

    code = "session_busy"
    http_status = 503


class QuotaExceeded(SandholdError):
    code = "quota_exceeded"
    http_status = 429


class PayloadTooLarge(SandholdError):
    code = "payload_too_large"
    http_status = 413
