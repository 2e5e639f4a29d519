"""The sandbox's end of egress: ``127.0.0.1:3128`` (the HTTP proxy of ``HTTP_PROXY``) and a DNS
stub on ``127.0.0.1:53``, both relayed to the host's egress proxy through the unix socket bound
at ``/run/sandhold-egress/proxy.sock``. The agent only moves bytes; every decision is taken on
the host, where the socket tells which sandbox is asking."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from .tunnel import splice

log = logging.getLogger("sandhold.agent")
DNS_TIMEOUT_S = 5.0


async def _forward(path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        upstream = await asyncio.open_unix_connection(path, limit=65536)
    except OSError as e:
        log.warning("egress proxy unreachable: %s", e)
        body = b"sandhold: the egress proxy is unreachable\n"
        writer.write(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nConnection: close"
            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        writer.close()
        return
    await splice((reader, writer), upstream)


class DnsStub(asyncio.DatagramProtocol):
    """Each UDP question goes to the proxy as an RFC 8484 message; the answer comes back."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.transport: asyncio.DatagramTransport | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        task = asyncio.ensure_future(self._relay(data, addr))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _relay(self, query: bytes, addr: Any) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(self.path)
            writer.write(
                b"POST /dns-query HTTP/1.1\r\nHost: dns\r\nContent-Type: "
                b"application/dns-message\r\nConnection: close\r\nContent-Length: %d"
                b"\r\n\r\n%s" % (len(query), query)
            )
            raw = await asyncio.wait_for(reader.read(), DNS_TIMEOUT_S)
            writer.close()
        except (OSError, TimeoutError):
            return  # the client retries or times out, as with a lost datagram
        head, _, body = raw.partition(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 200") and body and self.transport is not None:
            self.transport.sendto(body, addr)


async def start(cfg: dict[str, Any] | None) -> list[Any]:
    """Open the forwarder and the DNS stub; returns what to close at shutdown."""
    if not cfg:
        return []
    path = str(cfg["socket"])
    out: list[Any] = []
    server = await asyncio.start_server(
        lambda r, w: _forward(path, r, w), "127.0.0.1", int(cfg["proxy_port"]), limit=65536
    )
    out.append(server)
    loop = asyncio.get_running_loop()
    try:
        transport, _ = await loop.create_datagram_endpoint(
            lambda: DnsStub(path),
            local_addr=("127.0.0.1", int(cfg["dns_port"])),
            family=socket.AF_INET,
        )
        out.append(transport)
    except OSError as e:  # names then fail to resolve; the proxy still works by name
        log.error("DNS stub not started: %s", e)
    return out
