"""The connector's configuration file (TOML; docs/tunnel.md has an example)::

    [gateway]
    url = "https://gateway.example.com"     # the gateway's base URL
    tunnel_id = "tunnel_0123456789abcdef0123456789abcdef"
    token = "env:CONTROL_PLANE_API_KEY"      # or "file:/run/secrets/tunnel-token"
    # unix_socket = "/run/sandhold/gateway.sock"   # dial through a local socket (a sidecar)
    # ca_file = "/etc/ssl/gateway-ca.pem"

    [health]
    listen = "127.0.0.1:9464"                # or "unix:/run/sandhold/connector-health.sock"

    [[upstream]]
    channel = "main"
    url = "http://127.0.0.1:3001/mcp"         # MCP streamable HTTP

    [[upstream]]
    channel = "files"
    command = ["python3", "-m", "files_mcp"]  # MCP over stdio

Plain ``http://`` to the gateway is refused unless the host is a loopback address or the
connection goes through ``unix_socket``: the token must not cross a network in the clear.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sandhold.errors import ConfigError

CHANNEL_RE = r"^[a-z0-9_-]{1,64}$"
TUNNEL_ID_RE = r"^tunnel_[0-9a-f]{32}$"
TOKEN_ENV = "CONTROL_PLANE_API_KEY"  # as tunnel-client names its runtime key


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GatewayConfig(Strict):
    url: str = Field(description="The gateway's base URL (https; http only to loopback).")
    tunnel_id: str = Field(pattern=TUNNEL_ID_RE)
    token: str = Field(f"env:{TOKEN_ENV}", description="The token, env:VAR or file:/path.")
    unix_socket: str | None = None
    ca_file: str | None = None
    poll_timeout_ms: int = Field(15000, ge=100, le=300_000)
    max_concurrency: int = Field(8, ge=1, le=256)
    backoff_initial_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _plain_http(self) -> GatewayConfig:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"gateway.url {self.url!r} is not an http(s) URL")
        if parts.scheme == "http" and self.unix_socket is None and not _loopback(parts.hostname):
            raise ValueError(
                "gateway.url is plain http to a host that is not loopback: the tunnel token "
                "would cross the network in the clear; use https"
            )
        return self


class HealthConfig(Strict):
    listen: str | None = Field("127.0.0.1:9464", description="host:port or unix:/path; none: off")
    url_file: str | None = Field(None, description="Write the health URL here once listening.")


class UpstreamConfig(Strict):
    channel: str = Field("main", pattern=CHANNEL_RE)
    url: str | None = None
    command: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> UpstreamConfig:
        if (self.url is None) == (self.command is None):
            raise ValueError(
                f"upstream {self.channel!r}: give url (streamable HTTP) or command "
                "(stdio), one of them"
            )
        if self.command is not None and not self.command:
            raise ValueError(f"upstream {self.channel!r}: command is empty")
        return self


class LimitsConfig(Strict):
    max_response_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    request_timeout_s: float = Field(60.0, gt=0)


class ConnectorConfig(Strict):
    gateway: GatewayConfig
    health: HealthConfig = Field(default_factory=HealthConfig)  # type: ignore[arg-type]
    upstream: list[UpstreamConfig] = Field(min_length=1)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _channels(self) -> ConnectorConfig:
        names = [u.channel for u in self.upstream]
        if len(set(names)) != len(names):
            raise ValueError("two upstreams have the same channel")
        return self


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve(ref: str, what: str) -> str:
    """``env:VAR`` and ``file:/path`` references (tunnel-client's convention), else literal."""
    if ref.startswith("env:"):
        value = os.environ.get(ref[4:])
        if not value:
            raise ConfigError(f"{what}: the environment variable {ref[4:]} is not set")
        return value.strip()
    if ref.startswith("file:"):
        try:
            return Path(ref[5:]).read_text().strip()
        except OSError as e:
            raise ConfigError(f"{what}: cannot read {ref[5:]}: {e.strerror or e}") from None
    return ref


def load(path: str | Path) -> ConnectorConfig:
    try:
        raw: dict[str, Any] = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read the connector config {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"the connector config {path} is not valid TOML: {e}") from None
    try:
        return ConnectorConfig.model_validate(raw)
    except ValidationError as err:
        problems = [
            f"{'.'.join(map(str, e['loc'])) or 'config'}: {re.sub(r'^Value error, ', '', e['msg'])}"
            for e in err.errors(include_url=False)
        ]
        raise ConfigError(f"invalid connector config {path}: " + "; ".join(problems)) from None
