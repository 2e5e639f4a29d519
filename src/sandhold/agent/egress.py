"""The sandbox's end of egress: ``127.0.0.1:3128`` (the HTTP proxy of ``HTTP_PROXY``) and a DNS
stub on ``127.0.0.1:53``, both relayed to the host's egress proxy through the unix socket bound
at ``/run/sandhold-egress/proxy.sock``. The agent only moves bytes; every decision is taken on
the host, where the socket tells which sandbox is asking."""

from __future__ import annotations

import socket
from typing import Any

from . import aio, log
from .tunnel import splice

DNS_TIMEOUT_S = 5.0


async def _forward(path: str, reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
    try:
        upstream = await aio.open_unix_connection(path, limit=65536)
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


class DnsStub:
    """Each UDP question goes to the proxy as an RFC 8484 message; the answer comes back."""

    def __init__(self, path: str, sock: socket.socket) -> None:
        self.path, self.sock = path, sock
        self.tasks: set[aio.Task[None]] = set()
        sock.setblocking(False)
        self._loop = aio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data, addr = self.sock.recvfrom(65535)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:  # an ICMP error of an earlier answer's, say: nothing to keep
            log.warning("DNS stub: %s", e)
            return
        task = aio.ensure_future(self._relay(data, addr))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _relay(self, query: bytes, addr: Any) -> None:
        try:
            reader, writer = await aio.open_unix_connection(self.path)
            writer.write(
                b"POST /dns-query HTTP/1.1\r\nHost: dns\r\nContent-Type: "
                b"application/dns-message\r\nConnection: close\r\nContent-Length: %d"
                b"\r\n\r\n%s" % (len(query), query)
            )
            try:
                raw = await aio.wait_for(reader.read(), DNS_TIMEOUT_S)
            finally:
                writer.close()
        except (OSError, TimeoutError):
            return  # the client retries or times out, as with a lost datagram
        head, _, body = raw.partition(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 200") and body:
            try:
                self.sock.sendto(body, addr)
            except OSError:
                pass  # lost, as a datagram may be

    def close(self) -> None:
        self._loop.remove_reader(self.sock.fileno())
        self.sock.close()


async def start(cfg: dict[str, Any] | None) -> list[Any]:
    """Open the forwarder and the DNS stub; returns what to close at shutdown."""
    if not cfg:
        return []
    path = str(cfg["socket"])
    out: list[Any] = []
    server = await aio.start_server(
        lambda r, w: _forward(path, r, w), "127.0.0.1", int(cfg["proxy_port"]), limit=65536
    )
    out.append(server)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("127.0.0.1", int(cfg["dns_port"])))
        out.append(DnsStub(path, sock))
    except OSError as e:
        sock.close()  # names then fail to resolve; the proxy still works by name
        log.error("DNS stub not started: %s", e)
    return out
