"""The egress daemon's configuration: the egress part of ``Settings``, handed to the daemon by
the runtime with every sync (the daemon serves whichever runtime configured it last)."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from sandhold.config import Settings


class EgressConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: Path
    open_cidrs: list[str] = []
    deny_cidrs: list[str] = []
    hosts: dict[str, list[str]] = {}
    dns_servers: list[str] = []
    upstream_ca_file: Path | None = None
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    secrets_keys: list[str] = []
    secrets_key_file: Path | None = None
    secrets_kms_key_id: str | None = None
    secrets_kms_endpoint_url: str | None = None
    secrets_kms_region: str | None = None

    @property
    def root(self) -> Path:
        return self.data_dir / "egress"

    @classmethod
    def from_settings(cls, s: Settings) -> EgressConfig:
        return cls(
            data_dir=s.data_dir,
            open_cidrs=s.egress_open_cidrs,
            deny_cidrs=[*s.egress_deny_cidrs, *fleet_addresses(s)],
            hosts=s.egress_hosts,
            dns_servers=s.egress_dns_servers,
            upstream_ca_file=s.egress_upstream_ca_file,
            connect_timeout_s=s.egress_connect_timeout_s,
            idle_timeout_s=s.egress_idle_timeout_s,
            secrets_keys=s.secrets_keys,
            secrets_key_file=s.secrets_key_file,
            secrets_kms_key_id=s.secrets_kms_key_id,
            secrets_kms_endpoint_url=s.secrets_kms_endpoint_url,
            secrets_kms_region=s.secrets_kms_region,
        )


def fleet_addresses(s: Settings) -> list[str]:
    """Addresses of the fleet a host knows of itself: the Kubernetes API (a pod's
    ``KUBERNETES_SERVICE_HOST``), the snapshot store's endpoint and static ``fleet_hosts`` (the
    names resolved now, as the proxy would). Sandboxes never dial them."""
    hosts = [os.environ.get("KUBERNETES_SERVICE_HOST", "")]
    hosts += [
        urlsplit(u).hostname or "" for u in [s.snapshot_s3_endpoint_url or "", *s.fleet_hosts]
    ]
    out: list[str] = []
    for host in filter(None, hosts):
        try:
            ips = [str(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            try:
                ips = sorted({str(a[4][0]) for a in socket.getaddrinfo(host, None)})
            except OSError:
                continue  # a name that does not resolve here is not dialled either
        out += [f"{ip}/{32 if ':' not in ip else 128}" for ip in ips]
    return sorted(set(out))
