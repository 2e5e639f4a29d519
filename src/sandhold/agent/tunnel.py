"""``CONNECT 127.0.0.1:<port>``: a raw byte tunnel to a TCP port inside the sandbox.

The E2B server reaches user services (any sandbox port but envd's) through this. Only loopback
is allowed, so the agent is no general-purpose proxy, and only address literals, so no name is
ever resolved (which would block the agent's one thread).
"""

from __future__ import annotations

import socket

from . import aio
from .http import HttpError, Request, Response, Streams

_LOOPBACK = {"127.0.0.1": socket.AF_INET, "localhost": socket.AF_INET, "::1": socket.AF_INET6}
COPY_CHUNK = 65536
# Ports of the services the agent starts at boot (set from the config). A tunnel to one of them
# waits while the service is still starting instead of failing, so a client may call it right
# after the sandbox is created.
SERVICE_PORTS: set[int] = set()
SERVICE_WAIT_S = 20.0


def parse_authority(authority: str) -> tuple[str, int, int]:
    """``host:port`` (``[::1]:port`` for IPv6) → (address, port, family)."""
    host, sep, port_text = authority.rpartition(":")
    host = host.strip("[]").lower()
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise HttpError(400, f"invalid CONNECT authority {authority!r}")
    family = _LOOPBACK.get(host)
    if family is None:
        raise HttpError(403, f"only loopback ports can be tunnelled, not {host!r}")
    address = "127.0.0.1" if host == "localhost" else host
    return address, int(port_text), family


async def serve_connect(req: Request, resp: Response) -> None:
    """The router's CONNECT handler: answer 200, then hand the raw connection to the upstream
    socket."""
    try:
        upstream = await open_upstream(req.path)
    except HttpError as e:
        await resp.send_error(e.status, e.message)
        return
    try:
        await resp.start(200)
        client, leftover = req.take_over()
        if leftover:
            upstream[1].write(leftover)
        await splice(client, upstream)
    finally:
        upstream[1].close()


async def open_upstream(authority: str) -> Streams:
    address, port, family = parse_authority(authority)
    loop = aio.get_running_loop()
    deadline = loop.time() + (SERVICE_WAIT_S if port in SERVICE_PORTS else 0)
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await aio.wait_for(aio.sock_connect(sock, (address, port)), 10)
            return await aio.open_connection(sock=sock, limit=COPY_CHUNK)
        except ConnectionRefusedError as e:
            sock.close()
            if loop.time() >= deadline:
                raise HttpError(502, f"port {port} is not open in the sandbox: {e}") from None
            await aio.sleep(0.05)
        except (OSError, TimeoutError) as e:
            sock.close()
            raise HttpError(502, f"port {port} is not open in the sandbox: {e}") from None


async def _copy(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
    try:
        while data := await reader.read(COPY_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # pass the half-close on; the other direction may continue
    except (ConnectionError, OSError):
        writer.close()


async def splice(a: Streams, b: Streams) -> None:
    """Copy both ways until both directions are done."""
    try:
        await aio.gather(_copy(a[0], b[1]), _copy(b[0], a[1]))
    finally:
        a[1].close()
        b[1].close()
