"""The E2B-compatible server's settings (``sandhold serve``). Section ``[server]``: ``host`` and
``port`` set ``server_host`` and ``server_port``; the other keys are the field names
(``api_keys``, ``public_domain``, ...).

No combination of these fields is wrong for every process; what is wrong for the server is
judged when it starts (``check_server_serve``), against the address it really listens on."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from sandhold.config.layer import Layer
from sandhold.errors import ConfigError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServerSettings(Layer):
    toml_section: ClassVar[str] = "server"
    toml_prefix: ClassVar[str] = "server_"

    prebuild_templates: list[str] = Field(
        ["code-interpreter-v1"],
        description="Templates `sandhold serve` builds in the background at start-up.",
    )
    template_builds_at_once: int = Field(
        2, ge=1, description="Template builds (E2B's Template.build) running at once."
    )
    template_upload_max_mb: int = Field(
        1024, ge=1, description="Largest file archive a template build's COPY may upload."
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
    suspend_after_s: float = Field(
        600.0,
        description="How long a sandbox stays paused in memory (the freezer: fast resume) "
        "before it is checkpointed to disk (no process, no memory; resume restores it); 0: at "
        "once; negative: never. Needs CRIU (criu_path).",
    )
    server_console_sample_interval_s: float = Field(
        5.0,
        ge=0,
        description="How often each running sandbox's CPU, memory and disk are sampled into its "
        "history (in memory, the last 256 samples: the console's sandbox page, E2B's GET "
        "/sandboxes/{id}/metrics); 0: only when a call asks.",
    )
    reconcile_interval_s: float = Field(
        30.0,
        gt=0,
        description="How often the server cleans up sandboxes a crash left half-created or "
        "half-killed (and at start-up), whatever their age.",
    )
    server_max_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        le=1024 * 1024 * 1024,
        description="Largest control-plane request body (a create with every limit used fits in "
        "a fraction of the default); larger is a 413.",
    )
    server_max_query_bytes: int = Field(
        8 * 1024,
        ge=1024,
        le=64 * 1024,
        description="Longest query string of a control-plane request (list filters, metrics "
        "ids, page tokens).",
    )
    server_max_idempotency_key_chars: int = Field(
        255, ge=16, le=4096, description="Longest Idempotency-Key header of a create."
    )
    server_metrics: bool = Field(
        True,
        description="Prometheus metrics on GET /metrics (docs/observability.md); off, it serves "
        "only sandhold_suspend_to_disk (the gateway reads it) and no latency is observed.",
    )
    server_metrics_token: str | None = Field(
        None,
        description="A token that may read GET /metrics only, sent as `Authorization: Bearer "
        "<token>` (a Prometheus scrape config's `authorization`); any API key also may.",
    )
    host_mount_roots: list[Path] = Field(
        default_factory=list,
        description="Host directories under which a create's `host-mount` metadata (CubeSandbox's "
        "extension, used by the gateway for /workspace) may bind paths; empty refuses it.",
    )

    def check_server_serve(self, host: str) -> None:
        """Refuse to serve an open API: no API keys (any key is accepted) on ``host``, the
        address the server really listens on, unless it is a loopback address."""
        if not self.api_keys and not is_loopback(host):
            raise ConfigError(
                f"refusing to listen on {host}: no API keys are configured, so "
                "anyone who can reach the port could create sandboxes. Set SANDHOLD_API_KEYS "
                '(e.g. \'{"<key>": "<team>"}\') or listen on 127.0.0.1.'
            )
