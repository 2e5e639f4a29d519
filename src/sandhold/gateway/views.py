"""A session's file view: what of the host a session's sandbox sees, and which paths the file
tools may touch.

The view is the tenant's policy: the session's workspace (read-write, ``/workspace``), its
``skills`` (read-only host directories at ``/skills/<name>``) and ``references`` (read-only, at
``/reference/<name>``), nothing else of the host. Every path a file tool gets is normalized
lexically (relative paths are under ``/workspace``) and authorized against ``READ_ROOTS`` or
``WRITE_ROOTS`` before anything happens; the read-only binds are what make a symlink or a hard
link planted inside the sandbox useless for writing to a skill.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sandhold.config import Settings
from sandhold.errors import InvalidRequest, ViewDenied
from sandhold.runtime.spec import RESERVED_TARGETS

WORKSPACE = "/workspace"
VIEW_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
VIEW_TARGETS = {"skills": "/skills", "references": "/reference"}
# Reads: the workspace, the read-only views, and the sandbox's own scratch space (its /tmp and
# the sandbox user's home are inside the sandbox, never the host's). Writes: the same minus
# the read-only views.
READ_ROOTS = ("/workspace", "/skills", "/reference", "/tmp", "/home/user")
WRITE_ROOTS = ("/workspace", "/tmp", "/home/user")
RULES = {
    "read": "reads are allowed under " + ", ".join(READ_ROOTS),
    "write": "writes are allowed only under "
    + ", ".join(WRITE_ROOTS)
    + " (/skills and /reference are read-only)",
}

Access = Literal["read", "write"]


def check_view_entry(field: str, name: str, host_path: str) -> None:
    """Syntax of one ``skills``/``references`` entry (no file system access)."""
    where = f"{field}[{name!r}]"
    if not isinstance(name, str) or not VIEW_NAME_RE.match(name):
        raise ValueError(
            f"{where}: name is not valid: use 1-64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit"
        )
    if not isinstance(host_path, str) or not host_path or "\0" in host_path:
        raise ValueError(f"{where}: host path must be a non-empty string without NUL bytes")
    if not host_path.startswith("/"):
        raise ValueError(f"{where}: host path {host_path!r} must be absolute")
    if ".." in host_path.split("/"):
        raise ValueError(f"{where}: host path {host_path!r} must not contain '..'")
    if posixpath.normpath(host_path) != host_path or host_path.startswith("//"):
        raise ValueError(f"{where}: host path {host_path!r} is not normalized")


@dataclass(frozen=True)
class ViewMount:
    source: Path  # the real host directory (symlinks resolved)
    target: str


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def view_mounts(
    skills: dict[str, str], references: dict[str, str], settings: Settings
) -> list[ViewMount]:
    """Check the policy's views against the host and return what to bind read-only; raises
    InvalidRequest naming the field. Run when a policy is loaded or changed and again when a
    session's sandbox is created (the host may have changed since)."""
    if not skills and not references:
        return []
    roots = [r.resolve() for r in settings.gateway_view_roots]
    private = [
        p.resolve()
        for p in (
            settings.data_dir,
            settings.gateway_workspace_root_path,
            settings.gateway_deliverables_path,
        )
    ]
    out: list[ViewMount] = []
    targets: list[str] = []
    for field, entries in (("skills", skills), ("references", references)):
        for name, host_path in entries.items():
            where = f"policy.{field}[{name!r}]"
            try:
                check_view_entry(field, name, host_path)
            except ValueError as e:
                raise InvalidRequest(f"policy.{e}") from None
            if not roots:
                raise InvalidRequest(
                    f"{where}: no gateway_view_roots are configured, so no skills or "
                    "references are allowed"
                )
            real = Path(host_path).resolve()
            if not any(real == r or real.is_relative_to(r) for r in roots):
                raise InvalidRequest(
                    f"{where}: host path {host_path!r} (real path {str(real)!r}) is outside "
                    f"gateway_view_roots {[str(r) for r in roots]}"
                )
            if not real.is_dir():
                raise InvalidRequest(
                    f"{where}: host path {host_path!r} is not an existing directory"
                )
            for p in private:
                if _overlaps(real, p):
                    raise InvalidRequest(
                        f"{where}: host path {host_path!r} overlaps the gateway's own data "
                        f"({str(p)!r}: workspaces, deliverables or state)"
                    )
            target = f"{VIEW_TARGETS[field]}/{name}"
            for reserved in RESERVED_TARGETS:
                if target == reserved or (reserved != "/" and target.startswith(reserved + "/")):
                    raise InvalidRequest(f"{where}: target {target!r} is reserved")
            for other in targets:
                if (
                    other == target
                    or other.startswith(target + "/")
                    or target.startswith(other + "/")
                ):
                    raise InvalidRequest(f"{where}: target {target!r} overlaps {other!r}")
            targets.append(target)
            out.append(ViewMount(real, target))
    return out


def normalize(raw: str) -> str:
    """A tool's path as an absolute, lexically normalized sandbox path (``..`` resolved)."""
    if not isinstance(raw, str) or not raw or "\0" in raw:
        raise InvalidRequest("path must be a non-empty string without NUL bytes")
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
