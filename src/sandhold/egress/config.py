"""The egress daemon's configuration: the egress part of ``Settings``, handed to the daemon by
the runtime with every sync (the daemon serves whichever runtime configured it last)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sandhold.config import Settings


class EgressConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: Path
    open_cidrs: list[str] = []
    hosts: dict[str, list[str]] = {}
    dns_servers: list[str] = []
    upstream_ca_file: Path | None = None
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    secrets_keys: list[str] = []
    secrets_key_file: Path | None = None

    @property
    def root(self) -> Path:
        return self.data_dir / "egress"

    @classmethod
    def from_settings(cls, s: Settings) -> EgressConfig:
        return cls(
            data_dir=s.data_dir,
            open_cidrs=s.egress_open_cidrs,
            hosts=s.egress_hosts,
            dns_servers=s.egress_dns_servers,
            upstream_ca_file=s.egress_upstream_ca_file,
            connect_timeout_s=s.egress_connect_timeout_s,
            idle_timeout_s=s.egress_idle_timeout_s,
            secrets_keys=s.secrets_keys,
            secrets_key_file=s.secrets_key_file,
        )
