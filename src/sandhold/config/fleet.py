"""The fleet's settings (docs/fleet.md): a host's (``sandhold serve`` with ``fleet_host_id``) and
the edge's (``sandhold edge serve``). Section ``[fleet]``: the keys are the field names without
``fleet_`` (``host_id``, ``token``, ``discovery``, ...)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, SecretStr

from sandhold.config.layer import Layer
from sandhold.errors import ConfigError

HOST_ID = r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$"  # a node name (a DNS label or subdomain)


class FleetSettings(Layer):
    toml_section: ClassVar[str] = "fleet"
    toml_prefix: ClassVar[str] = "fleet_"

    # -- a host --
    fleet_host_id: str | None = Field(
        None,
        pattern=HOST_ID,
        description="This server is a fleet host with this identity (the node's name: "
        "spec.nodeName in a pod). Unset: a server of its own.",
    )
    fleet_token: SecretStr | None = Field(
        None,
        description="The secret edges and hosts share: an edge presents it to a host in "
        "X-Sandhold-Fleet-Token. Required on both.",
    )
    fleet_capacity: int = Field(
        64, ge=1, description="Sandboxes a host holds at once (running or paused in memory)."
    )
    fleet_store_after_s: float = Field(
        5.0,
        ge=0,
        description="A paused sandbox is kept in the shared store (snapshot_s3_bucket) this "
        "long after its pause: only stored sandboxes outlive their host's loss.",
    )
    fleet_drain_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Longest drain (SIGTERM or `sandhold host drain`): storing every sandbox "
        "and waiting for an edge to see it. Keep the pod's termination grace above it.",
    )
    # -- the edge --
    fleet_edge_host: str = Field("127.0.0.1", description="Address the edge listens on.")
    fleet_edge_port: int = Field(49980, ge=1, le=65535, description="Port of the edge.")
    fleet_catalog_url: str | None = Field(
        None,
        description="SQLAlchemy URL of the catalog (postgresql+psycopg://...): every edge "
        "replica shares it. A SQLite file in data_dir when unset (one edge only).",
    )
    fleet_discovery: Literal["dns", "static", "kubernetes"] = Field(
        "dns",
        description="How the edge finds hosts: a headless Service's DNS, a list, or the "
        "Service's EndpointSlices through the Kubernetes API (tells a draining host from a "
        "dead one; needs list on endpointslices: deploy/k8s/components/endpointslices).",
    )
    fleet_hosts: list[str] = Field(
        [], description="static discovery: the hosts' base URLs (http://10.0.0.5:49982)."
    )
    fleet_dns_name: str = Field(
        "sandhold-hosts", description="dns discovery: the name whose A/AAAA records are hosts."
    )
    fleet_dns_server: str | None = Field(
        None,
        description="dns discovery: the resolver (address[:port]); the system's when unset.",
    )
    fleet_host_port: int = Field(
        49982, ge=1, le=65535, description="dns discovery: the port hosts serve on."
    )
    fleet_kubernetes_api: str | None = Field(
        None,
        description="kubernetes discovery: the API's URL; in a pod, from KUBERNETES_SERVICE_HOST "
        "and _PORT, with the pod's service account token, CA and namespace.",
    )
    fleet_kubernetes_namespace: str | None = Field(
        None, description="kubernetes discovery: the hosts' namespace (default: the pod's)."
    )
    fleet_poll_s: float = Field(2.0, gt=0, description="How often the edge asks each host.")
    fleet_lost_after_s: float = Field(
        15.0,
        gt=0,
        description="A host that has not answered for this long is lost: its running "
        "sandboxes are gone.",
    )
    fleet_choices: int = Field(
        3, ge=1, description="Placement samples this many fitting hosts and takes the emptiest."
    )
    fleet_direct_domains: bool = Field(
        False,
        description="The edge hands the SDK the sandbox's host's own public_domain, so its "
        "traffic goes straight to the host; a sandbox that moves is then reached through a new "
        "connect. Off: the edge's public_domain, every call through an edge.",
    )

    def check_fleet_host(self) -> None:
        if self.fleet_host_id and self.fleet_token is None:
            raise ConfigError("fleet_host_id is set but fleet_token is not: a fleet host needs it")

    def check_fleet_edge(self) -> None:
        if self.fleet_token is None:
            raise ConfigError("the edge needs fleet_token, the secret its hosts know")
        if self.fleet_discovery == "static" and not self.fleet_hosts:
            raise ConfigError("fleet_discovery = 'static' needs fleet_hosts")
