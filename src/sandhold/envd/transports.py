"""How the host reaches a port inside a sandbox.

- envd's own port: the agent serves HTTP on the sandbox's unix socket.
- any other port: a ``CONNECT 127.0.0.1:<port>`` tunnel through that socket into the sandbox's
  network namespace (the agent splices it); ``tunnel_request``/``check_tunnel_reply`` are the
  handshake, written once for the E2B data plane (raw streams) and httpx (``TunnelTransport``).
- a remote sandbox: an E2B data plane URL with routing and token headers.

A ``Channel`` is the result either way: an httpx client, a base URL and headers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpcore
import httpx

from sandhold.envd import ENVD_PORT
from sandhold.errors import PortClosed, ProviderError, SandboxGone

MAX_REPLY_HEAD = 4096


@dataclass
class Channel:
    """An HTTP client to one port of one sandbox: requests go to ``base + path`` with
    ``headers`` (routing and access tokens)."""

    client: httpx.AsyncClient
    base: str
    headers: dict[str, str] = field(default_factory=dict)


def tunnel_request(port: int) -> bytes:
    authority = f"127.0.0.1:{port}"
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()


def check_tunnel_reply(head: bytes, port: int) -> None:
    """The agent's answer to a CONNECT (its head, up to the blank line): 200 or PortClosed."""
    status = head.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or status[1] != b"200":
        raise PortClosed(f"port {port} is not open in the sandbox", port)


class TunnelBackend(httpcore.AsyncNetworkBackend):
    """Every "TCP connection" is a CONNECT tunnel through the agent's socket."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self.inner.connect_unix_socket(self.socket_path, timeout)
        await stream.write(tunnel_request(port))
        head = b""
        try:
            while b"\r\n\r\n" not in head:  # the agent sends nothing after its answer's head
                chunk = await stream.read(1, timeout)
                if not chunk or len(head) > MAX_REPLY_HEAD:
                    raise PortClosed(f"the sandbox closed the tunnel to port {port}", port)
                head += chunk
            check_tunnel_reply(head, port)
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class TunnelTransport(httpx.AsyncHTTPTransport):
    def __init__(self, socket_path: str) -> None:
        super().__init__(verify=False)  # plain HTTP inside the tunnel
        self._pool = httpcore.AsyncConnectionPool(network_backend=TunnelBackend(socket_path))


class AgentSocketTransport(httpx.AsyncHTTPTransport):
    """envd on the agent's unix socket. Nothing accepting there means the sandbox is gone."""

    def __init__(self, socket_path: str) -> None:
        # No TLS on a unix socket: verify=False spares building a default SSL context (loading
        # the CA bundle), which took ~26 ms per client, i.e. per tool call.
        super().__init__(uds=socket_path, verify=False)
        self.socket_path = socket_path

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.ConnectError:
            raise SandboxGone(f"no agent answers on {self.socket_path}") from None


def agent_transport(socket_path: Path | str, port: int = ENVD_PORT) -> httpx.AsyncBaseTransport:
    if port == ENVD_PORT:
        return AgentSocketTransport(str(socket_path))
    return TunnelTransport(str(socket_path))


@contextlib.asynccontextmanager
async def agent_channel(
    socket_path: Path | str, port: int = ENVD_PORT, timeout: float | None = None
) -> AsyncIterator[Channel]:
    """A channel to a port of a sandbox on this host, through its agent's socket."""
    transport = agent_transport(socket_path, port)
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
        yield Channel(client, f"http://127.0.0.1:{port}")


def remote_channel(
    client: httpx.AsyncClient,
    sandbox_url: str | None,
    domain: str | None,
    sandbox_id: str,
    port: int,
    tokens: dict[str, str],
) -> Channel:
    """A channel to a port of a sandbox behind an E2B data plane: one URL routed by the
    ``E2b-Sandbox-Id``/``-Port`` headers (a Sandhold server), or ``{port}-{id}.{domain}`` hosts.
    ``tokens``: ``envd`` (X-Access-Token) and ``traffic`` (for ports other than envd's)."""
    headers: dict[str, str] = {}
    if tokens.get("envd"):
        headers["X-Access-Token"] = tokens["envd"]
    if port != ENVD_PORT and tokens.get("traffic"):
        headers["e2b-traffic-access-token"] = tokens["traffic"]
    if sandbox_url:
        headers.update({"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port)})
        return Channel(client, sandbox_url.rstrip("/"), headers)
    if not domain:
        raise ProviderError("no sandbox domain: a sandbox URL or a domain is needed")
    return Channel(client, f"https://{port}-{sandbox_id}.{domain}", headers)
