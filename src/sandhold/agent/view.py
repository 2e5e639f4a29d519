"""The sandbox's file view: which paths the file API (``/files`` and the Filesystem service) may
read and write, set by the host at boot (``AgentConfig.file_view``).

A path is checked as written (normalized) and as the sandbox resolves it (symlinks followed), and
both must be inside: a symlink planted by code in the sandbox cannot carry a file-API write out
of the view. Writes under a read-only mount are refused here with a clear message rather than
with EROFS half-way. The view binds the file API, not the sandbox's own processes (which the
mounts and the runtime confine); it is what a platform's file operations were authorized against.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from typing import Any, Literal

Access = Literal["read", "write"]
DENIED_MARK = "outside the sandbox's file view"  # in every refusal (the server's audit keys on it)


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class ViewGuard:
    def __init__(self, read: Sequence[str], write: Sequence[str], read_only: Sequence[str]):
        self.read = list(read)
        self.write = list(write)
        self.read_only = list(read_only)

    @classmethod
    def from_config(cls, raw: dict[str, Any] | None) -> ViewGuard:
        raw = raw or {}
        return cls(raw.get("read") or ["/"], raw.get("write") or ["/"], raw.get("read_only") or [])

    def rule(self, access: Access) -> str:
        if access == "read":
            return "reads are allowed under " + ", ".join(self.read)
        text = "writes are allowed under " + ", ".join(self.write)
        if self.read_only:
            text += " except the read-only " + ", ".join(self.read_only)
        return text

    def denial(self, path: str, access: Access, *, follow_last: bool = True) -> str | None:
        """Why ``path`` (absolute, normalized) may not be accessed, or None if it may.
        ``follow_last=False`` for operations on a link itself (remove, move)."""
        if follow_last:
            real = os.path.realpath(path)
        else:
            head, name = posixpath.split(path)
            real = posixpath.join(os.path.realpath(head), name)
        for candidate in dict.fromkeys((path, real)):
            ok = _under(candidate, self.read if access == "read" else self.write)
            if ok and access == "write" and _under(candidate, self.read_only):
                ok = False
            if not ok:
                shown = path if candidate == path else f"{path} (resolves to {candidate})"
                return f"{access} of {shown} is {DENIED_MARK}: {self.rule(access)}"
        return None

    def opened_denial(self, fd: int, path: str, access: Access) -> str | None:
        """Why the file open at ``fd`` (opened through ``path``) is outside the view, or None.
        Checked on the open file itself, so swapping a symlink between the path check and the
        ``open`` gains nothing."""
        real = os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)")
        if real == path or self.denial(real, access, follow_last=False) is None:
            return None
        return f"{access} of {path} (opened as {real}) is {DENIED_MARK}: {self.rule(access)}"
