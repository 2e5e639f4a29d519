"""HTTP forwarding, one request at a time: absolute-form requests (plain ``http://`` URLs) and
the decrypted requests of an intercepted tunnel share one ``exchange``, which re-frames the
request with h11 (one framing in, one framing out: no smuggling), adds the credential (over TLS
only) and relays the response with every credential of the host blanked out (``response``)."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import h11

from sandhold.egress.connection import MAX_HEAD, Connection, Target
from sandhold.egress.http_parts import HOP_BY_HOP, authority, closes, header, origin_form
from sandhold.egress.refusal import refused
from sandhold.egress.response import Relayed, relay
from sandhold.egress.scan import Scanner
from sandhold.egress.secrets import Injection

# Request headers that would make a scanned response harder to scan: a compressed body (the
# proxy asks for identity instead), or a part of one (a credential fetched a range at a time).
SCANNED_DROP = {b"accept-encoding", b"range", b"if-range"}


async def forward_plain(
    c: Connection, conn: h11.Connection, req: h11.Request, started: float
) -> None:
    url = urlsplit(req.target.decode("ascii", "replace"))
    if url.scheme != "http":
        raise refused(400, "use CONNECT (an https_proxy) for https:// URLs", "protocol")
    if url.username or url.password:
        raise refused(400, "credentials in the URL are not forwarded", "protocol")
    try:
        host, port = authority(url.netloc, 80)
    except ValueError:
        raise refused(400, f"invalid URL {url.geturl()!r}", "protocol") from None
    host_hdr = header(req.headers, b"host")
    if host_hdr is not None and authority(host_hdr, 80) != (host, port):
        raise refused(403, f"Host header {host_hdr!r} does not match the URL's host {host}", "host")
    target = await c.resolve_target(host, port)
    # One request per connection: the next may go to another host, under a newer policy.
    await exchange(c, conn, req, target, False, started, keep_alive=False)


def _upstream_headers(
    req: h11.Request, target: Target, tls: bool, injections: list[Injection], scanned: bool
) -> list[tuple[bytes, bytes]]:
    """The request's end-to-end headers, with the Host of the checked target, the credential in
    place of any header of that name, exactly one framing header, and ``Connection: close``;
    where the response will be scanned, ``Accept-Encoding: identity`` and no range."""
    dropped = HOP_BY_HOP | {b"host"} | {i.header.lower().encode() for i in injections}
    if scanned:
        dropped |= SCANNED_DROP
    headers = [(k, v) for k, v in req.headers if k.lower() not in dropped]
    default = 443 if tls else 80
    host_value = target.host if target.port == default else f"{target.host}:{target.port}"
    if ":" in target.host:
        host_value = f"[{target.host}]" + ("" if target.port == default else f":{target.port}")
    headers.insert(0, (b"Host", host_value.encode()))
    headers += [(i.header.encode(), i.value.encode()) for i in injections]
    te = header(req.headers, b"transfer-encoding")
    cl = header(req.headers, b"content-length")
    if te is not None:
        headers.append((b"Transfer-Encoding", b"chunked"))
    elif cl is not None:
        headers.append((b"Content-Length", cl.encode()))
    if scanned:
        headers.append((b"Accept-Encoding", b"identity"))
    headers.append((b"Connection", b"close"))
    return headers


async def exchange(
    c: Connection,
    conn: h11.Connection,
    req: h11.Request,
    target: Target,
    tls: bool,
    started: float,
    keep_alive: bool = True,
) -> None:
    """One request upstream and its response back. The credentials bound to the host are added
    (TLS only, never over plain HTTP) and blanked out of what comes back, over either (a host
    may hand back over plain HTTP what it was given over TLS)."""
    bound = c.shared.injections(c.sbx, target.host)
    # A secret never crosses plain HTTP; a rule's header without one does.
    injections = bound if tls else [i for i in bound if not i.secrets]
    scanner = Scanner(r for i in bound for r in i.secrets)
    headers = _upstream_headers(req, target, tls, injections, bool(scanner))
    up_reader, up_writer = await c.dial(target, tls=tls)
    up = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    sent = 0
    res = Relayed()
    try:
        up_writer.write(
            up.send(h11.Request(method=req.method, target=origin_form(req.target), headers=headers))
            or b""
        )
        if conn.they_are_waiting_for_100_continue:
            c.writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        while True:
            ev = await c.event(conn, c.reader)
            if isinstance(ev, h11.Data):
                sent += len(ev.data)
                up_writer.write(up.send(h11.Data(data=ev.data)) or b"")
                await up_writer.drain()
            elif isinstance(ev, h11.EndOfMessage):
                up_writer.write(up.send(h11.EndOfMessage()) or b"")
                break
            else:
                raise refused(400, "request ended early", "protocol")
        await up_writer.drain()
        keep = keep_alive and conn.their_http_version == b"1.1" and not closes(req.headers)
        res = await relay(c, conn, up, up_reader, target, scanner, keep)
    finally:
        up_writer.close()
        c.record(
            kind="mitm" if tls else "http",
            method=req.method.decode(),
            host=target.host,
            port=target.port,
            path=origin_form(req.target).decode("ascii", "replace"),
            status=res.status,
            bytes_out=sent,
            bytes_in=res.received,
            decision="allow",
            rule=target.decision.rule,
            reason=res.note,
            injected=[i.secret for i in injections] or None,
            duration_ms=round((time.monotonic() - started) * 1e3, 2),
        )
