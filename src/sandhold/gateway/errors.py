"""The gateway's wire tables: what each leaf of the error tree (``sandhold.errors``) becomes on
the REST surface (an HTTP status beside the leaf's ``{code, message}``) and on MCP (whether the
agent may retry the same call)."""

from __future__ import annotations

from sandhold import errors as e
from sandhold.errors import SandholdError, lookup

REST_STATUS: dict[type[SandholdError], int] = {
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
    e.IdempotencyMismatch: 409,
    e.PreconditionFailed: 412,
    e.PayloadTooLarge: 413,
    e.QuotaExceeded: 429,
    e.Unsupported: 501,
    e.Unavailable: 503,
    e.HostUnsupported: 503,
    e.SessionBusy: 503,
    e.LockLost: 503,
    e.EgressUnavailable: 503,
    e.GuestUnresponsive: 503,
    e.HostUnavailable: 503,
    e.SandboxStartFailed: 500,
    e.TemplateBuildFailed: 500,
    e.CheckpointFailed: 500,
    e.SecretKeyError: 500,
    e.EnvdError: 400,  # the sandbox refused the tool's request (bad path, missing file)
    e.PortClosed: 400,
    e.ProviderError: 502,
    e.SandboxGone: 502,
}

# MCP tool errors carry {code, message, retryable}: retryable says the same call may succeed
# later unchanged (a busy session, a provider hiccup), so an agent loop knows to wait, not fix.
MCP_RETRYABLE: dict[type[SandholdError], bool] = {
    cls: status in (502, 503) or cls is e.SandboxGone for cls, status in REST_STATUS.items()
}


def rest_status(err: SandholdError) -> int:
    return lookup(REST_STATUS, err)


def mcp_retryable(err: SandholdError) -> bool:
    return lookup(MCP_RETRYABLE, err)


def server_fault(err: SandholdError) -> bool:
    """Whether the failure is ours or the provider's rather than the caller's."""
    return rest_status(err) >= 500


def tool_error(tool: str, err: Exception) -> SandholdError:
    """What a tool call's failure becomes: the error tree's own errors as they are, a port the
    sandbox does not serve or a refusal of its envd as the caller's mistake, anything else as
    the provider's fault."""
    if isinstance(err, e.PortClosed):
        return e.ProviderError(str(err))
    if isinstance(err, e.EnvdError):
        message = f"{tool}: {err.message}" if err.message else f"{tool} failed: {err.code}"
        return e.InvalidRequest(message)
    if isinstance(err, SandholdError):
        return err
    return e.ProviderError(f"{tool} failed: {type(err).__name__}: {err}")
