"""The CLI's wire table: the exit status of a command that failed with a leaf of the error tree
(``sandhold.errors``), in the BSD ``sysexits.h`` range (64-78), so that it cannot be mistaken for
the exit status of a command run by ``sandhold sandbox exec`` (0-63 in practice); 1 is left to
Python (an uncaught bug) and 2 to typer (bad usage). 73 (EX_CANTCREAT) stands for a conflict."""

from __future__ import annotations

from sandhold import errors as e
from sandhold.errors import SandholdError, lookup

EXIT_STATUS: dict[type[SandholdError], int] = {
    e.SandholdError: 70,
    e.InvalidRequest: 65,
    e.ConfigError: 78,
    e.Unauthenticated: 77,
    e.Forbidden: 77,
    e.ViewDenied: 77,
    e.EgressRefused: 77,
    e.NotFound: 66,
    e.SandboxNotFound: 66,
    e.TemplateNotFound: 66,
    e.VolumeNotFound: 66,
    e.SessionNotFound: 66,
    e.Conflict: 73,
    e.SessionClosed: 73,
    e.NeedsNewSandbox: 73,
    e.IdempotencyMismatch: 73,
    e.PreconditionFailed: 73,
    e.PayloadTooLarge: 65,
    e.QuotaExceeded: 75,
    e.Unsupported: 69,
    e.Unavailable: 75,
    e.HostUnsupported: 69,
    e.SessionBusy: 75,
    e.LockLost: 75,
    e.EgressUnavailable: 75,
    e.GuestUnresponsive: 75,
    e.HostUnavailable: 75,
    e.SandboxStartFailed: 70,
    e.TemplateBuildFailed: 70,
    e.CheckpointFailed: 70,
    e.SecretKeyError: 78,
    e.EnvdError: 76,
    e.PortClosed: 76,
    e.ProviderError: 76,
    e.SandboxGone: 66,
}


def exit_status(err: SandholdError) -> int:
    return lookup(EXIT_STATUS, err)
