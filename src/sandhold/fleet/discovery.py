"""Where the hosts are: the base URLs the edge polls.

- ``dns`` (the default): the A and AAAA records of a name, a Kubernetes headless Service's (no
  API access needed) or Consul's, each address at ``fleet_host_port``. DNS cannot tell a draining
  host from a dead one; the edge asks each host itself (members.py).
- ``static``: ``fleet_hosts``, for systemd or Nomad hosts with fixed addresses.
"""

from __future__ import annotations

import ipaddress

import dns.asyncresolver
import dns.exception
import dns.resolver

from sandhold.config import Settings


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
