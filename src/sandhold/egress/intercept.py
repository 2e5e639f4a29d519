"""A ``CONNECT`` tunnel to a host with a credential rule: TLS is terminated with the deployment
CA and every request of the decrypted stream is checked and forwarded on its own, so the
credential can be added to it (``forward.exchange``) without the sandbox ever holding it."""

from __future__ import annotations

import asyncio
import ssl
import time

import h11

from sandhold.egress.connection import MAX_HEAD, Connection, Target
from sandhold.egress.forward import exchange
from sandhold.egress.http_parts import authority, header, origin_form
from sandhold.egress.refusal import framed_reply, refused
from sandhold.errors import EgressRefused


async def intercept(c: Connection, conn: h11.Connection, target: Target, started: float) -> None:
    """TLS termination for a host with an injection rule: serve HTTP requests from the
    decrypted stream, each sent upstream over verified TLS with the credential added."""
    c.writer.write(
        conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection established"))
        or b""
    )
    await c.writer.drain()
    data, _ = conn.trailing_data
    if data:  # a client must wait for the 200 before its ClientHello
        raise refused(400, "data sent before the tunnel was established", "protocol")
    server_ctx = c.shared.ca.server_context(target.host)
    try:
        await asyncio.wait_for(c.writer.start_tls(server_ctx), 10)
    except (ssl.SSLError, TimeoutError, ConnectionError) as e:
        c.record(
            kind="mitm",
            method="CONNECT",
            host=target.host,
            port=target.port,
            status=0,
            decision="deny",
            rule="tls",
            reason=f"client TLS failed: {e}",
        )
        return
    ssl_obj = c.writer.get_extra_info("ssl_object")
    sni = getattr(ssl_obj, "server_hostname", None) if ssl_obj else None
    if sni and sni.rstrip(".").lower() != target.host:
        c.record(
            kind="mitm",
            host=target.host,
            status=403,
            decision="deny",
            rule="sni",
            reason=f"TLS server name {sni!r} does not match {target.host}",
        )
        return
    await serve_requests(c, target, tls=True)


async def serve_requests(c: Connection, target: Target, tls: bool) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    while True:
        started = time.monotonic()
        try:
            ev = await c.event(conn, c.reader)
        except (h11.RemoteProtocolError, TimeoutError):
            return
        if not isinstance(ev, h11.Request):
            return
        try:
            host_hdr = header(ev.headers, b"host")
            if host_hdr is not None:
                h, p = authority(host_hdr, target.port)
                if h != target.host or p != target.port:
                    raise refused(
                        403,
                        f"Host header {host_hdr!r} does not match the tunnel to {target.host}",
                        "host",
                    )
            await exchange(c, conn, ev, target, tls, started)
        except EgressRefused as e:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                c.writer.write(framed_reply(conn, e))
            c.record(
                kind="mitm" if tls else "http",
                method=ev.method.decode(),
                host=target.host,
                port=target.port,
                path=origin_form(ev.target).decode("ascii", "replace"),
                status=e.status,
                decision="deny",
                rule=e.rule,
                reason=e.message,
                duration_ms=round((time.monotonic() - started) * 1e3, 2),
            )
            return
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:
            return
