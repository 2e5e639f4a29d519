"""The session gateway's settings (``sandhold gateway serve``, docs/gateway.md). Section
``[gateway]``: the keys are the field names without ``gateway_`` (``port``, ``provider``,
``e2b_api_url``, ``s3_bucket``, ``tenants``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from sandhold.config.layer import Layer
from sandhold.errors import ConfigError

MIN_KEY_LENGTH = 16  # the admin API refuses shorter tenant keys too
TENANT_KEYS = {"api_key", "policy"}


class GatewaySettings(Layer):
    toml_section: ClassVar[str] = "gateway"
    toml_prefix: ClassVar[str] = "gateway_"

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
    gateway_rollup_interval_s: float = Field(
        60.0,
        gt=0,
        description="How often each replica rolls up the timeline's finished hours for the "
        "console's usage views (store/rollups.py); replicas take each hour once.",
    )
    gateway_rollup_lag_s: float = Field(
        300.0,
        ge=0,
        le=86400,
        description="How long after an hour ends it is rolled up: events committed later than "
        "this into a rolled-up hour are left out of its rollup.",
    )
    gateway_reclaim_concurrency: int = Field(
        16,
        ge=1,
        le=256,
        description="Kills in flight at once during a reclaim pass. A local kill mostly waits "
        "(processes dying, unmounts, its loop device detaching), so more than the cores; 16 "
        "is the sandbox service's worker threads and the pass's former fixed bound.",
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
    gateway_timeline_text_bytes: int = Field(
        64 * 1024,
        ge=0,
        le=16 * 1024 * 1024,
        description="What the timeline keeps of each tool call's command or code, stdout and "
        "stderr (bytes each; the console shows and downloads them); 0 keeps none.",
    )
    gateway_command_env_max_vars: int = Field(
        128, ge=1, le=10_000, description="Variables a run_command call's `env` may set."
    )
    gateway_command_env_max_bytes: int = Field(
        64 * 1024,
        ge=1024,
        le=512 * 1024,
        description='All of a run_command call\'s `env` ("NAME=value" plus a NUL each, as '
        "execve counts it); the command also carries the sandbox's own environment.",
    )
    gateway_max_path_bytes: int = Field(
        4096,
        ge=64,
        le=4096,
        description="Longest path (or cwd) a tool call may name (PATH_MAX is 4096).",
    )
    gateway_admin_key: str | None = Field(
        None, description="Bearer key of the admin API (tenants, reclaim); admin API off if unset."
    )
    gateway_auth_cache_ttl_s: float = Field(
        5.0,
        ge=0,
        le=60,
        description="How long a replica keeps a tenant API key's tenant and policy after "
        "reading them from the store (gateway/keys.py); a key rotated or revoked through "
        "another replica, or a policy changed there, reaches this one within it (through this "
        "one: at once). 0: every request reads the store.",
    )
    gateway_metrics: bool = Field(
        True,
        description="Serve GET /metrics (Prometheus text) and count tool calls, sandbox "
        "operations, reclaim decisions and store calls; off: nothing is counted and /metrics "
        "answers 404.",
    )
    gateway_metrics_token: str | None = Field(
        None,
        description="Bearer token that reads GET /metrics only (what a Prometheus scrape config "
        "sends); the admin key reads it too.",
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

    # MCP tunnels (docs/tunnel.md)
    gateway_tunnel_poll_max_s: float = Field(
        25.0, gt=0, le=300, description="Longest a connector's long-poll is held (204 after)."
    )
    gateway_tunnel_call_timeout_s: float = Field(
        60.0, gt=0, description="Longest a tunnel tool call waits for its connector's answer."
    )
    gateway_tunnel_pickup_timeout_s: float = Field(
        10.0, gt=0, description="Longest a tunnel request waits for a connector to take it."
    )
    gateway_tunnel_stale_s: float = Field(
        10.0,
        gt=0,
        description="A connector not seen polling for this long is gone: no calls are queued "
        "for it, and a call it holds fails at once.",
    )
    gateway_tunnel_max_request_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest MCP request (JSON) sent through a tunnel."
    )
    gateway_tunnel_max_response_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest response a connector may post."
    )
    gateway_tunnel_max_pending: int = Field(
        64,
        ge=1,
        description="Most requests of one tunnel queued or held by its connector at once (more "
        "are refused with 429, so no tenant fills the store or the memory).",
    )
    gateway_tunnel_max_polls: int = Field(
        16,
        ge=1,
        description="Most long-polls of one tunnel held at once by a replica (more are refused "
        "with 429: each held poll reads the store; a connector process holds one).",
    )
    gateway_tunnel_tools_ttl_s: float = Field(
        30.0, ge=0, description="How long a replica keeps a tunnel's tool list before asking again."
    )
    gateway_tunnel_list_wait_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="Longest a tenant's tool listing waits for a tunnel never listed before "
        "(then it is listed without it, which comes in a later listing); a listed tunnel's "
        "last tools are served while a new list is fetched.",
    )
    gateway_tunnel_relay_interval_s: float = Field(
        0.2,
        gt=0,
        le=5,
        description="How often a replica reads the store for tunnel requests and answers other "
        "replicas queued (its own wake it at once).",
    )

    @model_validator(mode="after")
    def _check_gateway(self) -> GatewaySettings:
        """Refuse what no process can use: a provider or deliverables store chosen without the
        setting it needs, keys short enough to guess, tenants whose key a typo would drop.
        (The tenants' policies are checked when they are written to the store.)"""
        if self.gateway_provider == "e2b" and not self.gateway_e2b_api_url:
            raise ConfigError(
                "the e2b provider needs gateway_e2b_api_url: set SANDHOLD_GATEWAY_E2B_API_URL to "
                "the E2B-compatible server's API (e.g. http://127.0.0.1:49982), or use "
                "gateway_provider=local"
            )
        if self.gateway_deliverables == "s3" and not self.gateway_s3_bucket:
            raise ConfigError(
                "gateway_deliverables=s3 needs gateway_s3_bucket: set SANDHOLD_GATEWAY_S3_BUCKET "
                "(and, off AWS, SANDHOLD_GATEWAY_S3_ENDPOINT_URL), or use "
                "gateway_deliverables=local"
            )
        if self.gateway_admin_key is not None and len(self.gateway_admin_key) < MIN_KEY_LENGTH:
            raise ConfigError(
                f"gateway_admin_key must be at least {MIN_KEY_LENGTH} characters: set "
                "SANDHOLD_GATEWAY_ADMIN_KEY to a long random value, or leave it unset (then there "
                "is no admin API)"
            )
        token = self.gateway_metrics_token
        if token is not None and len(token) < MIN_KEY_LENGTH:
            raise ConfigError(
                f"gateway_metrics_token must be at least {MIN_KEY_LENGTH} characters: set "
                "SANDHOLD_GATEWAY_METRICS_TOKEN to a long random value, or leave it unset (then "
                "only the admin key reads /metrics)"
            )
        for tenant_id, spec in self.gateway_tenants.items():
            unknown = sorted(set(spec) - TENANT_KEYS)
            if unknown:
                raise ConfigError(
                    f"gateway_tenants: tenant {tenant_id!r} has unknown key {unknown[0]!r}; a "
                    'tenant is {"api_key": "...", "policy": {...}}'
                )
            key = spec.get("api_key")
            if key is not None and (not isinstance(key, str) or len(key) < MIN_KEY_LENGTH):
                raise ConfigError(
                    f"gateway_tenants: the api_key of tenant {tenant_id!r} must be a string of at "
                    f"least {MIN_KEY_LENGTH} characters"
                )
            if not isinstance(spec.get("policy") or {}, dict):
                raise ConfigError(
                    f"gateway_tenants: the policy of tenant {tenant_id!r} must be an object"
                )
        return self

    def check_gateway_serve(self, provider: str, mounts_workspaces: bool) -> None:
        """Refuse to serve sessions whose files would not survive their sandbox: ``provider``
        (the one built from these settings) cannot mount workspaces, and nobody said that is
        acceptable."""
        if not mounts_workspaces and not self.gateway_allow_ephemeral_workspace:
            raise ConfigError(
                f"the {provider} provider cannot mount workspaces, so session files "
                "would die with each sandbox; set gateway_allow_ephemeral_workspace=true to "
                "accept that"
            )
