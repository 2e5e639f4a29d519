"""The egress proxy's settings and the custody of secrets (``sandhold.egress``, docs/egress.md).
Section ``[egress]``: the keys are the field names without ``egress_`` (``open_cidrs``,
``e2b_enabled``); ``secrets_keys`` and ``secrets_key_file`` keep their names."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from sandhold.config.layer import Layer
from sandhold.errors import ConfigError


class EgressSettings(Layer):
    toml_section: ClassVar[str] = "egress"
    toml_prefix: ClassVar[str] = "egress_"

    egress_open_cidrs: list[str] = Field(
        default_factory=list,
        description="Internal ranges (loopback, RFC 1918, link-local, ...) that sandboxes with a "
        "matching allow rule may reach after all; empty keeps every internal range closed.",
    )
    egress_deny_cidrs: list[str] = Field(
        [],
        description="The fleet's own addresses (node, pod and service networks, the store, the "
        "database, the edge): never dialled, even inside egress_open_cidrs. The Kubernetes API "
        "(KUBERNETES_SERVICE_HOST), the snapshot store's endpoint and static fleet_hosts are "
        "added by themselves.",
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
    secrets_kms_key_id: str | None = Field(
        None,
        description="A KMS key (AWS KMS's API: id, ARN or alias) that wraps the secrets keys: "
        "the key file then holds them only wrapped (kms:...), unwrapped at start.",
    )
    secrets_kms_endpoint_url: str | None = Field(
        None, description="The KMS API's endpoint (a compatible service); AWS KMS when unset."
    )
    secrets_kms_region: str | None = Field(
        None, description="The KMS key's region (the AWS chain's when unset)."
    )

    @model_validator(mode="after")
    def _check_egress(self) -> EgressSettings:
        """Refuse what no process can use: E2B sandboxes open by default while the E2B surface
        gets no egress at all, and ranges or addresses the proxy could not parse (it would fail
        at its first sandbox, not at start-up)."""
        if self.egress_e2b_default == "open" and not self.egress_e2b_enabled:
            raise ConfigError(
                "egress_e2b_default=open needs egress_e2b_enabled: without it E2B sandboxes get "
                "no network at all. Set SANDHOLD_EGRESS_E2B_ENABLED=true, or leave "
                "egress_e2b_default at none."
            )
        for cidr in [*self.egress_open_cidrs, *self.egress_deny_cidrs]:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ConfigError(
                    f"egress_open_cidrs/egress_deny_cidrs: {cidr!r} is not an IP network "
                    "(e.g. 10.0.0.0/8)"
                ) from None
        for name, addresses in self.egress_hosts.items():
            for address in addresses:
                try:
                    ipaddress.ip_address(address)
                except ValueError:
                    raise ConfigError(
                        f"egress_hosts: {name!r} maps to {address!r}, which is not an IP address"
                    ) from None
        return self
