"""Errors of the E2B surface: every one becomes a JSON ``{code, message}`` body, because the
official SDK parses error bodies with ``Error.from_dict(response.json())``."""

from __future__ import annotations

from starlette.responses import JSONResponse

from sandhold.errors import Conflict, InvalidSpec, NotFound, SandholdError


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def not_found(sandbox_id: str) -> ApiError:
    # Also what another team gets: existence of foreign sandboxes is not revealed.
    return ApiError(404, f"sandbox {sandbox_id!r} doesn't exist or you don't have access to it")


def from_sandhold(e: SandholdError) -> ApiError:
    if isinstance(e, InvalidSpec):
        return ApiError(400, e.message)
    if isinstance(e, NotFound):
        return ApiError(404, e.message)
    if isinstance(e, Conflict):
        return ApiError(409, e.message)
    # Never 503: the SDK retries that status, which only delays a failure that will repeat.
    return ApiError(500, e.message)


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)
