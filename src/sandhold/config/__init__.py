"""One settings object for the whole process, read from ``SANDHOLD_*`` variables and an optional
TOML file named by ``SANDHOLD_CONFIG``, validated at start-up.

**Layers.** Each layer's fields, and the checks of them, live in one module: ``runtime``
(``RuntimeSettings``: data_dir, uid_base, limits, cgroup, ready timeout), ``server``
(``ServerSettings``: the E2B-compatible server), ``egress`` (``EgressSettings``: the egress proxy
and the secrets keys), ``gateway`` (``GatewaySettings``) and ``logs`` (``LogSettings``: the
JSON-lines log files of every serving process). ``Settings`` inherits all five, so every field
keeps its flat name (``settings.gateway_port``) and its environment variable is ``SANDHOLD_`` +
the name in capitals (``SANDHOLD_GATEWAY_PORT``).

**The TOML file** is written in sections, one per layer::

    [runtime]
    data_dir = "/srv/sandhold"

    [server]
    host = "0.0.0.0"                       # server_host
    api_keys = { "sk-team-a" = "team-a" }

    [egress]
    e2b_enabled = true                     # egress_e2b_enabled
    secrets_key_file = "/etc/sandhold/secrets.key"

    [gateway]
    port = 49991                           # gateway_port
    provider = "e2b"
    e2b_api_url = "http://10.0.0.5:49982"  # gateway_e2b_api_url

    [logs]
    max_bytes = 52428800                   # log_max_bytes

A key of a section is the field's name without the layer's prefix (``server_``, ``egress_``,
``gateway_``, ``log_``; the runtime has none); a field of the layer that does not carry the prefix
keeps its whole name (``api_keys``, ``public_domain``, ``secrets_keys``). The older forms still
work: a setting's whole name outside any section (``gateway_port = 49991``), and one ``[runtime]``
table holding whole names of every layer. An unknown section or key, or a field set twice, is
refused with a message that names it. The file's values win over the environment's.

**Checks.** Each layer's model validator refuses the combinations no process can use (e.g.
``gateway_provider = "e2b"`` without ``gateway_e2b_api_url``), when the settings are built.
What is wrong only for one process is checked by that process's start-up with a method of the
layer (``ServerSettings.check_server_serve``: no API keys on a non-loopback address;
``GatewaySettings.check_gateway_serve``: a provider that cannot mount workspaces; the names carry
the layer because ``Settings`` flattens methods as it flattens fields). These raise
``sandhold.errors.ConfigError``; ``load`` turns pydantic's own errors into it too, so the CLI
prints one clean message and exits with status 78.

Modules:

- ``egress.py``: The egress proxy's settings and the custody of secrets (``sandhold.egress``,
  docs/egress.md)
- ``fleet.py``: The fleet's settings: a host's and the edge's (docs/fleet.md)
- ``gateway.py``: The session gateway's settings (``sandhold gateway serve``, docs/gateway.md)
- ``layer.py``: What every layer of the settings shares
- ``limits.py``: What a create may ask for
- ``logs.py``: The logs' settings (``sandhold.logs``)
- ``runtime.py``: The runtime's settings (``sandhold.runtime``)
- ``server.py``: The E2B-compatible server's settings (``sandhold serve``)
- ``toml.py``: The settings file (``SANDHOLD_CONFIG``)
- ``worker.py``: The sandbox worker's settings (``sandhold worker``, docs/worker.md)
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from sandhold.config.egress import EgressSettings
from sandhold.config.fleet import FleetSettings
from sandhold.config.gateway import GatewaySettings
from sandhold.config.layer import Layer, env_name
from sandhold.config.logs import LogSettings
from sandhold.config.runtime import RuntimeSettings
from sandhold.config.server import ServerSettings, is_loopback
from sandhold.config.toml import read_file
from sandhold.config.worker import WorkerSettings
from sandhold.errors import ConfigError

__all__ = [
    "LAYERS",
    "EgressSettings",
    "FleetSettings",
    "GatewaySettings",
    "LogSettings",
    "RuntimeSettings",
    "ServerSettings",
    "Settings",
    "WorkerSettings",
    "describe",
    "get_settings",
    "is_loopback",
    "load",
]

LAYERS: tuple[type[Layer], ...] = (
    RuntimeSettings,
    ServerSettings,
    EgressSettings,
    GatewaySettings,
    LogSettings,
    WorkerSettings,
    FleetSettings,
)


class Settings(
    RuntimeSettings,
    ServerSettings,
    EgressSettings,
    GatewaySettings,
    LogSettings,
    WorkerSettings,
    FleetSettings,
    BaseSettings,
):
    model_config = SettingsConfigDict(env_prefix="SANDHOLD_", extra="forbid")

    # -- defaults that combine layers --
    @property
    def gateway_workspace_root_path(self) -> Path:
        return self.gateway_workspace_root or self.data_dir / "gateway" / "workspaces"

    @property
    def gateway_deliverables_path(self) -> Path:
        return self.gateway_deliverables_dir or self.data_dir / "gateway" / "deliverables"

    @property
    def log_path(self) -> Path:
        return self.log_dir or self.data_dir / "logs"

    @property
    def gateway_store(self) -> str:
        return self.gateway_store_url or f"sqlite:///{self.data_dir / 'gateway' / 'gateway.db'}"


def describe(e: ValidationError) -> str:
    """One line per refused value, naming the setting and its environment variable (never the
    value: it may be a key)."""
    parts = []
    for err in e.errors(include_url=False):
        loc = err["loc"]
        field = str(loc[0]) if loc else ""
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown setting {field!r}")
            continue
        where = ".".join(str(x) for x in loc)
        if field in Settings.model_fields:
            where += f" ({env_name(field)})"
        parts.append(f"{where}: {err['msg']}")
    return "invalid settings: " + "; ".join(parts)


def load(**overrides: Any) -> Settings:
    """The settings of this process: the environment, the file of ``SANDHOLD_CONFIG`` over it,
    ``overrides`` (e.g. command-line options) over both. Raises ``ConfigError``."""
    path = os.environ.get("SANDHOLD_CONFIG")
    values = read_file(path, LAYERS) if path else {}
    values.update(overrides)
    try:
        return Settings(**values)
    except ValidationError as e:
        raise ConfigError(describe(e)) from None
    except SettingsError as e:  # an environment variable that is not valid JSON, e.g.
        raise ConfigError(f"invalid settings: {e}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load()
