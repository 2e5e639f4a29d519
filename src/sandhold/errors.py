"""The one exception tree of the host side: every error Sandhold raises on purpose is a leaf of it.

Each error carries a stable machine-readable ``code``. What a leaf becomes on a wire is not its
own business: one table per wire format maps leaves to answers (``sandhold.e2b.errors`` for the
E2B JSON surface, ``sandhold.gateway.errors`` for the gateway's REST and MCP surfaces,
``sandhold.cli.errors`` for exit statuses), and ``tests/test_errors.py`` fails when a leaf is
missing from any of them. The in-sandbox agent is not host side: it is standard-library only and
answers in envd's own codes, which ``EnvdError`` carries back.

::

    SandholdError                          internal        (a bug, or an unexpected failure)
    ├── InvalidRequest                     invalid_argument  bad input; nothing was changed
    │   └── ConfigError                    invalid_config    settings refused at start-up
    ├── Unauthenticated                    unauthorized      no or a wrong credential
    ├── Forbidden                          forbidden         authenticated, but not allowed
    │   ├── ViewDenied                     view_denied       outside the session's file view
    │   └── EgressRefused                  egress_refused    the egress policy said no
    ├── NotFound                           not_found
    │   ├── SandboxNotFound                                  (also: another team's sandbox)
    │   ├── TemplateNotFound
    │   ├── VolumeNotFound
    │   └── SessionNotFound
    ├── Conflict                           conflict          the object's state forbids it
    │   ├── SessionClosed                  session_closed
    │   ├── NeedsNewSandbox                needs_new_sandbox the change needs a new sandbox
    │   ├── IdempotencyMismatch            idempotency_mismatch  key reused, other request
    │   └── PreconditionFailed             precondition_failed  changed since the caller looked
    ├── PayloadTooLarge                    payload_too_large
    ├── QuotaExceeded                      quota_exceeded
    ├── Unsupported                        unsupported       a known feature not built here
    ├── Unavailable                        unavailable       try again later
    │   ├── HostUnsupported                failed_precondition  missing kernel feature or tool
    │   ├── SessionBusy                    session_busy      another replica holds the session
    │   ├── LockLost                       lock_lost         our lease ran out mid-operation
    │   ├── EgressUnavailable              egress_unavailable
    │   ├── GuestUnresponsive              guest_unresponsive  the sandbox's agent does not answer
    │   └── HostUnavailable                host_unavailable  a fleet's host does not answer now
    ├── SandboxStartFailed                 sandbox_start_failed
    ├── TemplateBuildFailed                template_build_failed
    ├── CheckpointFailed                   checkpoint_failed  a dump or restore did not work
    ├── SecretKeyError                     secret_key        the secrets key ring is unusable
    ├── EnvdError                          (envd's code)     the sandbox's agent said no
    │   └── PortClosed                     port_closed       nothing listens on that port
    └── ProviderError                      provider_error    the sandbox provider failed
        └── SandboxGone                    sandbox_gone      it no longer exists there
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

V = TypeVar("V")


class SandholdError(Exception):
    """Base class of every error Sandhold raises on purpose."""

    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(SandholdError):
    """The request is malformed or asks for something impossible; nothing was changed."""

    code = "invalid_argument"


class ConfigError(InvalidRequest):
    """The settings are incomplete or dangerous; the process refuses to start."""

    code = "invalid_config"


class Unauthenticated(SandholdError):
    code = "unauthorized"


class Forbidden(SandholdError):
    code = "forbidden"


class ViewDenied(Forbidden):
    """A path outside the session's file view (or a write to a read-only part of it)."""

    code = "view_denied"

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class EgressRefused(Forbidden):
    """The egress proxy refuses a connection: its message is what the sandbox is told,
    ``status`` the HTTP status it is answered with (403 for the policy, 400 for a malformed
    request, 502/504 for an upstream that failed), ``rule`` what the audit log records."""

    code = "egress_refused"

    def __init__(self, message: str, status: int = 403, rule: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.rule = rule


class NotFound(SandholdError):
    code = "not_found"


class SandboxNotFound(NotFound):
    pass


class TemplateNotFound(NotFound):
    pass


class VolumeNotFound(NotFound):
    pass


class SessionNotFound(NotFound):
    pass


class Conflict(SandholdError):
    """The object's state does not allow the operation (e.g. pausing a paused sandbox)."""

    code = "conflict"


class SessionClosed(Conflict):
    code = "session_closed"


class NeedsNewSandbox(Conflict):
    """The sandbox cannot take the change (e.g. egress added to a sandbox created without any):
    only a new sandbox can have it."""

    code = "needs_new_sandbox"


class IdempotencyMismatch(Conflict):
    """An idempotency key came back with a different request than the one it first named."""

    code = "idempotency_mismatch"


class PreconditionFailed(Conflict):
    """A conditional operation found its object changed since the caller looked at it."""

    code = "precondition_failed"


class PayloadTooLarge(SandholdError):
    code = "payload_too_large"


class QuotaExceeded(SandholdError):
    code = "quota_exceeded"


class Unsupported(SandholdError):
    """A known operation or option this server deliberately does not implement."""

    code = "unsupported"


class Unavailable(SandholdError):
    """A dependency is missing or busy; the same request may succeed later."""

    code = "unavailable"


class HostUnsupported(Unavailable):
    """A kernel feature or host tool the runtime needs is missing; `sandhold doctor` explains."""

    code = "failed_precondition"


class SessionBusy(Unavailable):
    """The session's lock stayed taken (another replica is creating or reclaiming its sandbox)."""

    code = "session_busy"


class LockLost(Unavailable):
    """A lease expired (or was taken over) while its holder was still working."""

    code = "lock_lost"


class EgressUnavailable(Unavailable):
    code = "egress_unavailable"


class GuestUnresponsive(Unavailable):
    """The sandbox's agent (envd) did not answer its health check, so an operation that needs
    a healthy guest (a strict pause) was refused; nothing was changed."""

    code = "guest_unresponsive"


class HostUnavailable(Unavailable):
    """The fleet host that holds a sandbox did not answer the edge's last poll (or the call),
    or no host could take a sandbox up; the SDK retries (503), and a host silent for long is
    lost (docs/fleet.md)."""

    code = "host_unavailable"


class SandboxStartFailed(SandholdError):
    code = "sandbox_start_failed"


class TemplateBuildFailed(SandholdError):
    code = "template_build_failed"


class CheckpointFailed(SandholdError):
    """CRIU could not checkpoint or restore a sandbox; the sandbox is left as it was."""

    code = "checkpoint_failed"


class SecretKeyError(SandholdError):
    """The secrets key ring is missing, malformed or cannot open a stored secret."""

    code = "secret_key"


class EnvdError(SandholdError):
    """The sandbox's agent answered with an error (bad path, missing file, ...): ``code`` is
    envd's own (``not_found``, ``invalid_argument``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class PortClosed(EnvdError):
    """Nothing listens on the port inside the sandbox (e.g. no code interpreter)."""

    def __init__(self, message: str, port: int = 0) -> None:
        super().__init__("port_closed", message)
        self.port = port


class ProviderError(SandholdError):
    """The sandbox provider failed or answered something unexpected."""

    code = "provider_error"


class SandboxGone(ProviderError):
    """The sandbox no longer exists at the provider (killed, expired or reclaimed)."""

    code = "sandbox_gone"

    def __init__(self, message: str, sandbox_id: str = "") -> None:
        super().__init__(message)
        self.sandbox_id = sandbox_id


def all_classes() -> list[type[SandholdError]]:
    """Every class of the tree (the root and inner nodes too: each can be raised as such)."""
    out: list[type[SandholdError]] = []
    todo: list[type[SandholdError]] = [SandholdError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def lookup(table: Mapping[type[SandholdError], V], e: SandholdError) -> V:
    """The answer of the nearest class of ``e`` in a wire table (tables list every class; a
    subclass defined outside this module still finds its parent's answer)."""
    for cls in type(e).__mro__:
        if cls in table:
            return table[cls]
    return table[SandholdError]
