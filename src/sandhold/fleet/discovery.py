"""Where the hosts are: the base URLs the edge polls.

- ``dns`` (the default): the A and AAAA records of a name, a Kubernetes headless Service's (no
  API access needed) or Consul's, each address at ``fleet_host_port``. DNS cannot tell a draining
  host from a dead one; the edge asks each host itself (members.py).
- ``static``: ``fleet_hosts``, for systemd or Nomad hosts with fixed addresses.
- ``kubernetes``: the EndpointSlices of the Service ``fleet_dns_name`` (``GET`` through the API,
  each poll: no watch to keep), with the pod's service account. Endpoints that serve are hosts,
  and so are terminating ones: a draining host (not ready) is still a host.

Whatever the source, the edge keeps polling a host that left it while it still answers
(members.py): a draining host leaves DNS (not ready) but must be heard until it has handed its
sandboxes over.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

import dns.asyncresolver
import dns.exception
import dns.resolver

from sandhold.config import Settings
from sandhold.errors import ConfigError

ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class Discovery:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.resolver = dns.asyncresolver.Resolver(configure=settings.fleet_dns_server is None)
        if settings.fleet_dns_server is not None:
            host, _, port = settings.fleet_dns_server.rpartition(":")
            if not host or not port.isdigit():  # an address alone
                host, port = settings.fleet_dns_server, "53"
            self.resolver.nameservers = [host.strip("[]")]
            self.resolver.port = int(port)
        self.resolver.lifetime = 2.0

    async def addresses(self) -> list[str]:
        s = self.settings
        if s.fleet_discovery == "static":
            return [u.rstrip("/") for u in s.fleet_hosts]
        if s.fleet_discovery == "kubernetes":
            return await self._endpoint_slices()
        found: list[str] = []
        for kind in ("A", "AAAA"):
            try:
                answer = await self.resolver.resolve(s.fleet_dns_name, kind, search=True)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer, dns.resolver.NoNameservers):
                continue
            except dns.exception.Timeout:
                continue
            for rr in answer:
                ip = ipaddress.ip_address(rr.to_text())
                host = f"[{ip}]" if ip.version == 6 else str(ip)
                found.append(f"http://{host}:{s.fleet_host_port}")
        return sorted(set(found))

    # -- kubernetes ------------------------------------------------------------------------------
    def _api(self) -> tuple[str, str, dict[str, str], str | bool]:
        """The API's URL, the namespace, the headers and the TLS verification to use."""
        s = self.settings
        api = s.fleet_kubernetes_api
        if api is None:
            host, port = (
                os.environ.get("KUBERNETES_SERVICE_HOST"),
                os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
            )
            if not host:
                raise ConfigError(
                    "fleet_discovery = 'kubernetes' outside a pod needs fleet_kubernetes_api"
                )
            api = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        namespace = s.fleet_kubernetes_namespace
        if namespace is None:
            namespace = (ACCOUNT / "namespace").read_text().strip()
        headers = {"Accept": "application/json"}
        token = ACCOUNT / "token"
        if token.exists():  # read at each poll: the kubelet rotates it
            headers["Authorization"] = f"Bearer {token.read_text().strip()}"
        ca = ACCOUNT / "ca.crt"
        return api.rstrip("/"), namespace, headers, str(ca) if ca.exists() else True

    async def _endpoint_slices(self) -> list[str]:
        import httpx

        api, namespace, headers, verify = self._api()
        url = f"{api}/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        params = {"labelSelector": f"kubernetes.io/service-name={self.settings.fleet_dns_name}"}
        async with httpx.AsyncClient(verify=verify, timeout=5) as client:
            r = await client.get(url, params=params, headers=headers)
        r.raise_for_status()
        return sorted(set(hosts_of(r.json(), self.settings.fleet_host_port)))


def hosts_of(slices: dict[str, Any], default_port: int) -> list[str]:
    """The base URLs of an EndpointSliceList's endpoints that serve or terminate (a draining
    host is not ready, and must still be polled until it has handed its sandboxes over)."""
    out = []
    for item in slices.get("items") or []:
        ports = [p.get("port") for p in item.get("ports") or [] if p.get("port")]
        port = ports[0] if ports else default_port
        for endpoint in item.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            serving = conditions.get("serving", conditions.get("ready", True))
            if not (serving or conditions.get("terminating")):  # (terminating: draining)
                continue
            for address in endpoint.get("addresses") or []:
                ip = ipaddress.ip_address(address)
                out.append(f"http://[{ip}]:{port}" if ip.version == 6 else f"http://{ip}:{port}")
    return out
