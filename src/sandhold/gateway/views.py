"""A session's file view: which sandbox paths the gateway's file tools may touch.

Every path a file tool gets (and ``run_command``'s ``cwd``) is normalized lexically (relative
paths are under ``/workspace``, ``..`` resolved) and authorized against ``READ_ROOTS`` or
``WRITE_ROOTS`` before anything happens. ``/skills`` and ``/reference`` are where read-only
host directories of the tenant's policy are to be shown (not mounted yet: the runtime cannot
create mount points outside the template's directories); they are readable, never writable.
"""

from __future__ import annotations

import posixpath
from typing import Literal

from sandhold.errors import InvalidSpec, SandholdError

WORKSPACE = "/workspace"
# Reads: the workspace, the read-only views, and the sandbox's own scratch space (its /tmp and
# the sandbox user's home are inside the sandbox, never the host's). Writes: the same minus
# the read-only views.
READ_ROOTS = ("/workspace", "/skills", "/reference", "/tmp", "/home/user")
WRITE_ROOTS = ("/workspace", "/tmp", "/home/user")
RULES = {
    "read": "reads are allowed under " + ", ".join(READ_ROOTS),
    "write": "writes are allowed only under " + ", ".join(WRITE_ROOTS)
    + " (/skills and /reference are read-only)",
}  # fmt: skip

Access = Literal["read", "write"]


class ViewDenied(SandholdError):
    """A file operation outside the session's view; nothing was done."""

    code = "view_denied"
    http_status = 403

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def normalize(raw: str) -> str:
    """A tool's path as an absolute, lexically normalized sandbox path (``..`` resolved)."""
    if not isinstance(raw, str) or not raw or "\0" in raw:
        raise InvalidSpec("path must be a non-empty string without NUL bytes")
    norm = posixpath.normpath(posixpath.join(WORKSPACE, raw))
    return "/" + norm.lstrip("/")  # normpath keeps a leading '//'


def allowed(path: str, access: Access) -> bool:
    roots = READ_ROOTS if access == "read" else WRITE_ROOTS
    return any(path == r or path.startswith(r + "/") for r in roots)


def authorize(tool: str, raw: str, access: Access) -> str:
    """The normalized path if ``access`` to it is in the view, else ViewDenied."""
    path = normalize(raw)
    if not allowed(path, access):
        shown = raw if raw == path else f"{raw!r} (normalized: {path})"
        raise ViewDenied(
            f"{tool}: {access} of {shown} is outside the session's file view: {RULES[access]}",
            path,
        )
    return path
