"""What a sandbox is made of: the validated request the runtime turns into namespaces."""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sandhold.egress.header_rules import HeaderRule
from sandhold.egress.policy import EgressPolicy

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"


def clipped(value: str, width: int = 48) -> str:
    """``value`` for an error message: never the whole of an oversized one."""
    return repr(value) if len(value) <= width else f"{value[:width]!r}... ({len(value)} chars)"


# Paths inside the sandbox that the runtime itself owns; a user mount may not cover them.
RESERVED_TARGETS = (
    "/",
    "/proc",
    "/dev",
    "/sys",
    "/tmp",
    "/run/sandhold",
    "/run/sandhold-egress",
    "/opt/sandhold",
    "/usr",
    "/etc",
    "/workspace",
)

MAX_MEMORY_MB = (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // (1024 * 1024)
MAX_CPUS = os.cpu_count() or 1


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    memory_mb: int = Field(512, ge=16, le=MAX_MEMORY_MB, description="RAM, also the RAM+swap cap")
    cpu: float = Field(1.0, gt=0.0, le=MAX_CPUS, description="CPU quota in cores")
    pids: int = Field(512, ge=16, le=32768, description="max tasks (processes + threads)")
    disk_mb: int | None = Field(
        None,
        ge=8,
        description="Writable layer's budget (MiB); unset: the template's, else the settings' "
        "default_disk_mb; at most max_disk_mb. The runtime records the one it enforced.",
    )


class Mount(BaseModel):
    """A host directory shown inside the sandbox (chosen by the operator, never by its code)."""

    model_config = ConfigDict(extra="forbid")

    source: Path
    target: str
    read_only: bool = True

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"mount target {v!r} must be an absolute path")
        if "\0" in v or any(part == ".." for part in v.split("/")):
            raise ValueError(f"mount target {v!r} must not contain '..'")
        norm = posixpath.normpath(v)
        for reserved in RESERVED_TARGETS:
            if norm == reserved or (reserved != "/" and norm.startswith(reserved + "/")):
                raise ValueError(f"mount target {norm!r} is reserved by the runtime")
        return norm

    @field_validator("source")
    @classmethod
    def _source(cls, v: Path, info: ValidationInfo) -> Path:
        if info.context and info.context.get("stored"):
            return v  # a record of a running sandbox: the host may have changed since, fine
        if not v.is_absolute():
            raise ValueError(f"mount source {str(v)!r} must be an absolute host path")
        real = v.resolve()
        if not real.is_dir():
            raise ValueError(f"mount source {str(v)!r} is not an existing directory")
        return real


class NetworkPolicy(EgressPolicy):
    """The sandbox always gets its own network namespace with just a loopback device. With mode
    ``none`` that is all; with ``allowlist`` or ``open`` the only way out is the host's egress
    proxy, which enforces ``allow``/``deny`` (see docs/egress.md) and injects ``tenant``'s
    secrets. Rules can change on a running sandbox (``Runtime.update_network``); the mode can
    change too, except from or to ``none`` (which has no proxy at all)."""

    tenant: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$",
        description="Whose secrets the egress proxy may inject (set by the operator).",
    )
    header_rules: list[HeaderRule] = Field(
        default_factory=list,
        description="Headers set on requests per host, naming the tenant's secrets (E2B's "
        "network.rules; sandhold.egress.header_rules).",
    )


class FileView(BaseModel):
    """What the sandbox's file API (envd's ``/files`` and Filesystem service, served by the
    agent) may read and write: directories inside the sandbox. Paths are checked as given and as
    the sandbox resolves them; writes under a read-only mount are refused too. The default is
    the whole sandbox. It binds the file API, not the sandbox's own processes."""

    model_config = ConfigDict(extra="forbid")

    read: list[str] = Field(default_factory=lambda: ["/"], description="readable roots")
    write: list[str] = Field(default_factory=lambda: ["/"], description="writable roots")

    @field_validator("read", "write")
    @classmethod
    def _roots(cls, v: list[str]) -> list[str]:
        for root in v:  # how many, and how long: sandhold.service.limits
            if not isinstance(root, str) or not root.startswith("/") or "\0" in root:
                raise ValueError(f"file view root {root!r} must be an absolute path")
            if any(part == ".." for part in root.split("/")) or posixpath.normpath(root) != root:
                raise ValueError(f"file view root {root!r} must be normalized (no '..', '//')")
        return v


class SandboxSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    template: str = "base"
    limits: Limits = Field(default_factory=Limits)
    env: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    workspace_id: str | None = Field(
        None, description="Host workspace bound at /workspace; it outlives the sandbox."
    )
    workspace_dir: Path | None = Field(
        None,
        description="A host directory bound at /workspace, for callers that keep workspaces "
        "themselves (e.g. on NFS); exclusive with workspace_id.",
    )
    workspace_disk_mb: int | None = Field(
        None,
        ge=8,
        description="The workspace's disk budget (MiB): its files live in an ext4 image of that "
        "size in its directory, at most max_disk_mb; grown if larger than the image, never "
        "shrunk. Unset: uncapped, unless the workspace has an image already (then that). The "
        "runtime records the one it enforced.",
    )
    mounts: list[Mount] = Field(default_factory=list)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    file_view: FileView = Field(default_factory=FileView)
    user: str | None = Field(None, description="Default user of processes; the template's if unset")
    workdir: str | None = None

    @field_validator("template")
    @classmethod
    def _template(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"template name {clipped(v)} is not valid: {NAME_RULE}")
        return v

    @field_validator("workspace_id")
    @classmethod
    def _workspace(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.match(v):
            raise ValueError(
                f"workspace id {v!r} must be 1-64 characters of letters, digits, '.', '_' or '-'"
            )
        return v

    @field_validator("workspace_dir")
    @classmethod
    def _workspace_dir(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if v is None or (info.context and info.context.get("stored")):
            return v
        if not v.is_absolute():
            raise ValueError(f"workspace_dir {str(v)!r} must be an absolute host path")
        real = v.resolve()
        if not real.is_dir():
            raise ValueError(f"workspace_dir {str(v)!r} is not an existing directory")
        return real

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not ENV_KEY_RE.match(key):
                raise ValueError(f"environment variable name {clipped(key)} is not valid")
            if "\0" in value:
                raise ValueError(f"environment variable {key!r} contains a NUL byte")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and v not in ("root", "user"):
            raise ValueError(f"user {v!r} does not exist; sandboxes have 'root' and 'user'")
        return v

    @model_validator(mode="after")
    def _distinct_targets(self) -> SandboxSpec:
        seen: set[str] = set()
        for m in self.mounts:
            for other in seen:
                if (
                    m.target == other
                    or m.target.startswith(other + "/")
                    or other.startswith(m.target + "/")
                ):
                    raise ValueError(f"mount targets {other!r} and {m.target!r} overlap")
            seen.add(m.target)
        if self.workspace_id is not None and self.workspace_dir is not None:
            raise ValueError("give workspace_id or workspace_dir, not both")
        if self.workspace_disk_mb is not None and not (self.workspace_id or self.workspace_dir):
            raise ValueError("workspace_disk_mb needs a workspace (workspace_id or workspace_dir)")
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise ValueError(f"workdir {self.workdir!r} must be an absolute path")
        return self


def validation_message(e: ValidationError) -> str:
    """A pydantic error as one line naming each offending field."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "spec"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
