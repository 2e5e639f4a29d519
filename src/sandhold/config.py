"""One settings object for the whole process, read from ``SANDHOLD_*`` variables (and an optional
TOML file named by ``SANDHOLD_CONFIG``), validated at start-up."""

from __future__ import annotations

import hashlib
import os
import tomllib
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDHOLD_", extra="forbid")

    data_dir: Path = Field(
        Path("/var/lib/sandhold"),
        description="Templates, sandbox state, writable layers and workspaces live here.",
    )
    uid_base: int = Field(
        100000,
        ge=65536,
        description="Host uid/gid that sandbox root maps to; sandbox uid N is host uid_base+N.",
    )
    default_memory_mb: int = Field(512, ge=16)
    default_cpu: float = Field(1.0, gt=0)
    default_pids: int = Field(512, ge=16)
    cgroup_parent: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Parent cgroup of all sandboxes; derived from data_dir when unset.",
    )
    ready_timeout_s: float = Field(10.0, gt=0, description="How long create waits for the agent.")

    # -- the E2B-compatible server (`sandhold serve`) --
    prebuild_templates: list[str] = Field(
        ["code-interpreter-v1"],
        description="Templates `sandhold serve` builds in the background at start-up.",
    )
    server_host: str = Field("127.0.0.1", description="Address `sandhold serve` listens on.")
    server_port: int = Field(49982, ge=1, le=65535, description="Port of both API planes.")
    api_keys: dict[str, str] = Field(
        default_factory=dict,
        description="X-API-KEY value -> team. Empty: any key is accepted, on loopback only.",
    )
    max_timeout_hours: int = Field(24, ge=1, description="Longest sandbox timeout a call may set.")
    public_domain: str | None = Field(
        None,
        description="Domain of `{port}-{id}.{domain}` sandbox hosts, returned to the SDK as "
        "`domain`; unset means clients must set E2B_SANDBOX_URL.",
    )
    public_traffic_default: bool = Field(
        False,
        description="Whether sandbox ports other than envd's are reachable without the "
        "sandbox's traffic token when a create does not say (E2B's default is true).",
    )
    auto_resume_min_timeout_s: int = Field(
        60, ge=1, description="Floor of the timeout a sandbox gets when traffic auto-resumes it."
    )
    lifecycle_interval_s: float = Field(
        0.5, gt=0, description="How often the server enforces sandbox end times."
    )
    host_mount_roots: list[Path] = Field(
        default_factory=list,
        description="Host directories under which a create's `host-mount` metadata (CubeSandbox's "
        "extension, used by the gateway for /workspace) may bind paths; empty refuses it.",
    )


    @property
    def cgroup_group(self) -> str:
        if self.cgroup_parent:
            return self.cgroup_parent
        if self.data_dir == Path("/var/lib/sandhold"):
            return "sandhold"
        return "sandhold-" + hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:10]


def _load() -> Settings:
    path = os.environ.get("SANDHOLD_CONFIG")
    if path:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        return Settings(**data.get("runtime", data))
    return Settings()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return _load()
