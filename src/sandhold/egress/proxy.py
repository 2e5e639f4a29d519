"""One sandbox's egress proxy: what the daemon runs for each connection on a sandbox's socket.

The socket identifies the sandbox (it is bind-mounted into that sandbox only), so nothing the
sandbox sends can claim another identity. A connection carries one of:

- ``CONNECT host:port``: a tunnel. Hosts with a credential-injection rule are intercepted (TLS
  terminated with the deployment CA, each request checked and given the credential, then sent
  upstream over verified TLS: ``intercept``); any other host is spliced through untouched, after
  the TLS ClientHello's SNI (if any) was checked against the CONNECT host (``tunnel``).
- ``GET http://host/...`` (absolute form): plain HTTP, forwarded one request per upstream
  connection, re-framed by h11 (so no smuggling: one framing in, one framing out: ``forward``).
- ``POST /dns-query``: a DNS question (RFC 8484 message), relayed by the agent's DNS stub
  (``dns_query``).

This module reads the first request and dispatches it. Every decision is the policy's
(``policy.CompiledPolicy``) on the name asked for and on every address it resolved to; the proxy
dials only an address it checked (``connection``). Denials are immediate 403s that name the rule
(``refusal``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import h11

from sandhold.egress.connection import MAX_HEAD, Connection, SandboxEgress, Shared
from sandhold.egress.dns_query import dns_query
from sandhold.egress.forward import forward_plain
from sandhold.egress.http_parts import authority
from sandhold.egress.intercept import intercept
from sandhold.egress.refusal import refused, reply
from sandhold.egress.tunnel import tunnel
from sandhold.errors import EgressRefused, SecretKeyError

log = logging.getLogger("sandhold.egress")


async def serve(c: Connection) -> None:
    """Read the connection's first request and hand it to its path; answer a refusal."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    started = time.monotonic()
    req: h11.Request | None = None
    try:
        ev = await c.event(conn, c.reader)
        if not isinstance(ev, h11.Request):
            return
        req = ev
        method = req.method.decode()
        target = req.target.decode("ascii", "replace")
        if method == "CONNECT":
            await _connect(c, conn, target, started)
        elif target.startswith("http://") or target.startswith("https://"):
            await forward_plain(c, conn, req, started)
        elif method == "POST" and target.split("?")[0] == "/dns-query":
            await dns_query(c, conn)
        else:
            raise refused(
                400,
                "this is the sandbox's egress proxy: use it as HTTP_PROXY "
                "(absolute URLs or CONNECT)",
                "protocol",
            )
    except EgressRefused as e:
        _refuse(c, e, req, started)
    except h11.RemoteProtocolError as e:
        _refuse(c, refused(400, f"malformed request: {e}", "protocol"), req, started)
    except (TimeoutError, ConnectionError, OSError, ssl.SSLError):
        pass
    finally:
        c.writer.close()


async def _connect(c: Connection, conn: h11.Connection, target: str, started: float) -> None:
    """A CONNECT: checked like any request, then intercepted if the sandbox's tenant has a
    credential for the host, else tunnelled."""
    host, port = authority(target, None)
    checked = await c.resolve_target(host, port)
    if c.shared.intercepts(c.sbx, host):
        await intercept(c, conn, checked, started)
        return
    await tunnel(c, conn, checked, target, started)


def _refuse(c: Connection, e: EgressRefused, req: h11.Request | None, started: float) -> None:
    """Record the refusal, then answer it: the audit has it before the sandbox sees it."""
    method = req.method.decode() if req else None
    host = path = None
    port = None
    if req is not None:
        t = req.target.decode("ascii", "replace")
        if method == "CONNECT":
            path = t
            try:
                host, port = authority(t, None)
            except EgressRefused:
                pass
        else:
            parts = urlsplit(t)
            host, path = parts.hostname, parts.path or t
    c.record(
        kind="connect" if method == "CONNECT" else "http",
        method=method,
        host=host,
        port=port,
        path=path,
        status=e.status,
        decision="deny",
        rule=e.rule,
        reason=e.message,
        duration_ms=round((time.monotonic() - started) * 1e3, 2),
    )
    try:
        c.writer.write(reply(e))
    except (ConnectionError, RuntimeError):
        pass


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def handler(get_sandbox: Callable[[], SandboxEgress | None], shared: Shared) -> Handler:
    """The connection callback of one sandbox's socket; the sandbox (and so its current policy)
    is looked up per connection, so a policy update applies to the next connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sbx = get_sandbox()
        if sbx is None:
            writer.close()
            return
        try:
            await serve(Connection(sbx, shared, reader, writer))
        except SecretKeyError as e:
            log.error("sandbox %s: %s", sbx.id, e.message)
            writer.close()
        except Exception:
            log.exception("egress connection of sandbox %s failed", sbx.id)
            writer.close()

    return handle
