"""Name resolution on the host, for the proxy: a static hosts map (operator setting), then the
configured upstream DNS servers, else the host's own resolver. Results are cached briefly; the
proxy checks every address it gets and dials one of those, never re-resolving. A name that does
not resolve raises ``EgressRefused`` (the proxy tells it apart by where it catches it)."""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import socket
import time

from sandhold.egress import dns
from sandhold.errors import EgressRefused, InvalidRequest

CACHE_MAX_TTL = 30.0
CACHE_SIZE = 4096
QUERY_TIMEOUT_S = 2.0


class _DnsClient(asyncio.DatagramProtocol):
    def __init__(self, fut: asyncio.Future[bytes]) -> None:
        self.fut = fut

    def datagram_received(self, data: bytes, addr: object) -> None:
        if not self.fut.done():
            self.fut.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.fut.done():
            self.fut.set_exception(exc)


class Resolver:
    def __init__(
        self, hosts: dict[str, list[str]] | None = None, servers: list[str] | None = None
    ) -> None:
        self.hosts = {k.rstrip(".").lower(): list(v) for k, v in (hosts or {}).items()}
        self.servers = list(servers or [])
        self._cache: dict[str, tuple[float, list[str]]] = {}
        self.lookups = 0  # upstream lookups made (tests and the bench read it)

    async def resolve(self, name: str) -> list[str]:
        name = name.rstrip(".").lower()
        try:
            ipaddress.ip_address(name)
            return [name]
        except ValueError:
            pass
        if name in self.hosts:
            return list(self.hosts[name])
        hit = self._cache.get(name)
        if hit is not None and hit[0] > time.monotonic():
            return list(hit[1])
        self.lookups += 1
        if self.servers:
            addrs, ttl = await self._query_servers(name)
        else:
            addrs, ttl = await self._getaddrinfo(name), CACHE_MAX_TTL
        if not addrs:
            raise EgressRefused(f"{name} does not resolve")
        if len(self._cache) >= CACHE_SIZE:
            self._cache.clear()
        self._cache[name] = (time.monotonic() + min(ttl, CACHE_MAX_TTL), addrs)
        return list(addrs)

    async def _getaddrinfo(self, name: str) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise EgressRefused(f"{name} does not resolve: {e.strerror}") from None
        out: list[str] = []
        for info in infos:
            addr = str(info[4][0])
            if addr not in out:
                out.append(addr)
        return out

    async def _query_servers(self, name: str) -> tuple[list[str], float]:
        last: Exception | None = None
        for server in self.servers:
            try:
                results = await asyncio.gather(
                    self._query(server, name, dns.TYPE_A), self._query(server, name, dns.TYPE_AAAA)
                )
            except (OSError, TimeoutError, InvalidRequest) as e:  # InvalidRequest: malformed answer
                last = e
                continue
            (rc4, a4, t4), (rc6, a6, t6) = results
            if rc4 == dns.RCODE_NXDOMAIN and rc6 in (dns.RCODE_NXDOMAIN, dns.RCODE_OK) and not a6:
                raise EgressRefused(f"{name} does not exist (NXDOMAIN)")
            return a4 + a6, min(t4, t6)
        raise EgressRefused(f"no DNS server answered for {name}: {last}")

    async def _query(self, server: str, name: str, qtype: int) -> tuple[int, list[str], int]:
        loop = asyncio.get_running_loop()
        qid = secrets.randbelow(65536)
        fut: asyncio.Future[bytes] = loop.create_future()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _DnsClient(fut), remote_addr=(server, 53)
        )
        try:
            transport.sendto(dns.build_query(qid, name, qtype))
            data = await asyncio.wait_for(fut, QUERY_TIMEOUT_S)
        finally:
            transport.close()
        return dns.parse_answer(data, qid)
