"""Per-tenant policy: everything about a session's sandbox that the operator decides and a tool
argument can never change (template, limits, network, keep-alive, retention, quotas, the
read-only skills and references of the session's file view: see ``views.py``)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from sandhold.egress.policy import EgressPolicy
from sandhold.gateway.views import check_view_entry
from sandhold.runtime.spec import ENV_KEY_RE, clipped

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class TenantPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    template: str = Field("base", description="Sandbox template of the tenant's sessions.")
    memory_mb: int = Field(512, ge=16, description="RAM of a sandbox (local provider).")
    cpu: float = Field(1.0, gt=0, description="CPU quota in cores (local provider).")
    pids: int = Field(512, ge=16, description="Max processes and threads (local provider).")
    network: EgressPolicy = Field(
        default_factory=EgressPolicy,
        description="Egress of the tenant's sandboxes (docs/egress.md): mode none (loopback "
        "only, the default), allowlist or open, with allow/deny rules (domains, *.domains, IPs, "
        "CIDRs). The egress proxy injects the tenant's secrets. A change reaches live sandboxes "
        "at their next tool call.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Non-secret sandbox env vars.")
    keep_alive_s: int = Field(900, ge=1, le=86400, description="Idle time before auto-pause.")
    retention_s: int = Field(
        3600, ge=0, description="How long a paused sandbox is kept before it is reclaimed."
    )
    max_live_sandboxes: int = Field(
        100, ge=0, description="Sandboxes (running or paused) the tenant may hold at once."
    )
    max_command_timeout_s: int = Field(600, ge=1, description="Longest tool call allowed.")
    workspace_disk_mb: int | None = Field(
        None,
        ge=8,
        description="Disk budget of a session's workspace (MiB): its files live in an ext4 image "
        "of that size in the workspace directory, writes past it fail with ENOSPC inside; at "
        "most the sandbox host's max_disk_mb. Unset: uncapped. A larger value grows the image "
        "at the session's next sandbox; a smaller one is not applied (images never shrink). "
        "Local provider and the sandhold flavor of the e2b provider.",
    )
    workspace_on_close: Literal["keep", "delete"] = Field(
        "keep", description="What close_session does with the session's workspace."
    )
    skills: dict[str, str] = Field(
        default_factory=dict,
        description="Read-only host directories shown at /skills/<name> (name -> absolute host "
        "path under gateway_view_roots).",
    )
    references: dict[str, str] = Field(
        default_factory=dict,
        description="Read-only host directories shown at /reference/<name> (name -> absolute "
        "host path under gateway_view_roots).",
    )

    @field_validator("network", mode="before")
    @classmethod
    def _network_mode(cls, v: object) -> object:
        return {"mode": v} if isinstance(v, str) else v  # "open" is short for {"mode": "open"}

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        # The format here, when the policy is written; the sizes are the sandbox service's
        # (sandbox_env_*), judged at each create with that server's settings.
        for name, value in v.items():
            if not ENV_KEY_RE.match(name) or "\0" in value:
                raise ValueError(
                    f"env: {clipped(name)} is not a valid variable name, or its "
                    "value has a NUL byte"
                )
        return v

    @field_validator("template")
    @classmethod
    def _template(cls, v: str) -> str:
        if not ID_RE.match(v):
            raise ValueError(f"template name {v!r} is not valid")
        return v

    @field_validator("skills", "references")
    @classmethod
    def _views(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for name, host_path in v.items():
            check_view_entry(str(info.field_name), name, host_path)
        return v


def check_id(value: str, what: str, pattern: re.Pattern[str] = ID_RE) -> str:
    """Ids become directory names and metadata values: keep them short and URL-safe."""
    from sandhold.errors import InvalidRequest

    if not isinstance(value, str) or not pattern.match(value):
        raise InvalidRequest(
            f"{what} {value!r} is not valid: use 1-{128 if pattern is SESSION_ID_RE else 64} "
            "letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value
