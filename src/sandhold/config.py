"""One settings object for the whole process, read from ``SANDHOLD_*`` variables (and an optional
TOML file named by ``SANDHOLD_CONFIG``), validated at start-up."""

from __future__ import annotations

import hashlib
import os
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

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

    # -- egress (src/sandhold/egress, docs/egress.md) --
    egress_open_cidrs: list[str] = Field(
        default_factory=list,
        description="Internal ranges (loopback, RFC 1918, link-local, ...) that sandboxes with a "
        "matching allow rule may reach after all; empty keeps every internal range closed.",
    )
    egress_hosts: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Static name -> addresses map the egress proxy resolves with first.",
    )
    egress_dns_servers: list[str] = Field(
        default_factory=list,
        description="Upstream DNS servers of the egress proxy; the host's resolver when empty.",
    )
    egress_upstream_ca_file: Path | None = Field(
        None,
        description="CA bundle the proxy verifies upstream TLS with when it injects credentials "
        "(the system bundle when unset).",
    )
    egress_sandbox_ca_files: list[Path] = Field(
        default_factory=list,
        description="Extra CA certificates sandboxes with egress trust (beside the system bundle "
        "and the deployment's egress CA), e.g. an internal CA.",
    )
    egress_connect_timeout_s: float = Field(10.0, gt=0, description="Upstream connect timeout.")
    egress_idle_timeout_s: float = Field(300.0, gt=0, description="Idle egress connections close.")
    egress_e2b_enabled: bool = Field(
        False,
        description="Let E2B creates ask for egress (allow_internet_access, network.allowOut/"
        "denyOut) and PUT /sandboxes/{id}/network change it; off, those are refused (400).",
    )
    egress_e2b_default: Literal["none", "open"] = Field(
        "none",
        description="Egress of E2B sandboxes whose create says neither allow_internet_access nor "
        "network.allowOut (E2B cloud's default is open).",
    )
    egress_e2b_updatable: bool = Field(
        True,
        description="E2B sandboxes created without egress still get the (deny-all) proxy, so "
        "PUT /sandboxes/{id}/network can open it later; false gives them no proxy at all.",
    )
    secrets_keys: list[str] = Field(
        default_factory=list,
        description="Keys sealing stored secrets (base64url, 32 bytes), newest first; when empty "
        "the key file is used.",
    )
    secrets_key_file: Path | None = Field(
        None,
        description="Key file (one key per line, newest first, mode 0600); "
        "data_dir/egress/secrets.key when unset, created on first use.",
    )

    # -- the session gateway (`sandhold gateway serve`) --
    gateway_host: str = Field("127.0.0.1", description="Address the gateway listens on.")
    gateway_port: int = Field(49990, ge=1, le=65535, description="Port of the gateway's API.")
    gateway_store_url: str | None = Field(
        None,
        description="SQLAlchemy URL of the store; a SQLite file in data_dir when unset. Use "
        "PostgreSQL (postgresql+psycopg://...) for several replicas.",
    )
    gateway_provider: Literal["local", "e2b"] = Field(
        "local", description="Where sandboxes run: this process's runtime, or an E2B endpoint."
    )
    gateway_e2b_api_url: str | None = Field(None, description="Control plane of the e2b provider.")
    gateway_e2b_api_key: str | None = Field(None, description="X-API-KEY for the e2b provider.")
    gateway_e2b_sandbox_url: str | None = Field(
        None,
        description="One URL for all sandbox traffic (routed by E2b-Sandbox-Id), as a Sandhold "
        "server offers; unset means https://{port}-{id}.{domain} hosts.",
    )
    gateway_e2b_domain: str | None = Field(None, description="Sandbox domain for host routing.")
    gateway_e2b_flavor: Literal["sandhold", "e2b", "cube"] = Field(
        "sandhold", description="Which E2B-compatible server the e2b provider talks to."
    )
    gateway_provider_timeout_s: float = Field(
        60.0, gt=0, description="Longest control-plane request to the provider."
    )
    gateway_workspace_root: Path | None = Field(
        None,
        description="Session workspaces live under <root>/<tenant>/<session> (NFS in "
        "production, shared with the sandbox hosts); data_dir/gateway/workspaces when unset.",
    )
    gateway_allow_ephemeral_workspace: bool = Field(
        False,
        description="Start even if the provider cannot mount workspaces (files then die with "
        "the sandbox).",
    )
    gateway_deliverables: Literal["local", "s3"] = Field(
        "local", description="Where published deliverables are copied."
    )
    gateway_deliverables_dir: Path | None = Field(
        None, description="Local deliverables store; data_dir/gateway/deliverables when unset."
    )
    gateway_s3_bucket: str | None = Field(None, description="Bucket of the s3 deliverables store.")
    gateway_s3_endpoint_url: str | None = Field(
        None, description="S3-compatible endpoint (MinIO, Ceph, OBS, COS); AWS when unset."
    )
    gateway_s3_region: str | None = Field(None, description="Region of the S3 bucket.")
    gateway_s3_prefix: str = Field("deliverables/", description="Key prefix of deliverables.")
    gateway_public_url: str | None = Field(
        None, description="Base URL of this gateway as clients reach it (deliverable URLs)."
    )
    gateway_tag_prefix: str = Field(
        "sandhold.",
        pattern=r"^[A-Za-z0-9._-]{0,32}$",
        description="Prefix of the sandbox metadata tags (session_id, tenant_id, gateway).",
    )
    gateway_name: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="Tag value of this gateway deployment: it reclaims only its own sandboxes.",
    )
    gateway_replica_id: str | None = Field(
        None, description="Name of this replica in the timeline; host-pid when unset."
    )
    gateway_reclaim_interval_s: float = Field(
        60.0, gt=0, description="How often each replica runs a reclaim pass."
    )
    gateway_lock_ttl_s: float = Field(
        30.0,
        gt=0,
        description="Lease of the per-session lock; must exceed the slowest create or resume.",
    )
    gateway_orphan_grace_s: float = Field(
        120.0, gt=0, description="Age after which a tagged sandbox no session owns is killed."
    )
    gateway_max_payload_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Largest file, code or output a tool moves."
    )
    gateway_admin_key: str | None = Field(
        None, description="Bearer key of the admin API (tenants, reclaim); admin API off if unset."
    )
    gateway_tenants: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Tenants written to the store at start: id -> {api_key, policy}.",
    )
    gateway_view_roots: list[Path] = Field(
        default_factory=list,
        description="Host directories under which a tenant policy's `skills` and `references` "
        "(read-only views at /skills/<name>, /reference/<name>) may lie, symlinks resolved; "
        "empty allows none. The e2b provider's server needs them in its host_mount_roots.",
    )

    @property
    def gateway_workspace_root_path(self) -> Path:
        return self.gateway_workspace_root or self.data_dir / "gateway" / "workspaces"

    @property
    def gateway_deliverables_path(self) -> Path:
        return self.gateway_deliverables_dir or self.data_dir / "gateway" / "deliverables"

    @property
    def gateway_store(self) -> str:
        return self.gateway_store_url or f"sqlite:///{self.data_dir / 'gateway' / 'gateway.db'}"

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
