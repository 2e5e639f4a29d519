"""The exception tree shared by every layer.

Each error carries a stable machine-readable ``code`` so that the HTTP surfaces can turn it into a
structured ``{code, message}`` body without guessing.
"""

from __future__ import annotations


class SandholdError(Exception):
    """Base class of every error Sandhold raises on purpose."""

    code = "internal"
    http_status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidSpec(SandholdError):
    """The request is malformed or asks for something impossible; nothing was changed."""

    code = "invalid_argument"
    http_status = 400


class NotFound(SandholdError):
    code = "not_found"
    http_status = 404


class TemplateNotFound(NotFound):
    pass


class SandboxNotFound(NotFound):
    pass


class Conflict(SandholdError):
    """The object's state does not allow the operation (e.g. pausing a paused sandbox)."""

    code = "conflict"
    http_status = 409


class HostUnsupported(SandholdError):
    """A kernel feature or host tool the runtime needs is missing; `sandhold doctor` explains."""

    code = "failed_precondition"
    http_status = 503


class SandboxStartFailed(SandholdError):
    code = "sandbox_start_failed"
    http_status = 500
