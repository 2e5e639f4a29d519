"""HTTP forwarding, one request at a time: absolute-form requests (plain ``http://`` URLs) and
the decrypted requests of an intercepted tunnel share one ``exchange``, which re-frames the
request with h11 (one framing in, one framing out: no smuggling), adds the credential (over TLS
only) and blanks it out of the response."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import h11

from sandhold.egress.connection import MAX_HEAD, Connection, Target
from sandhold.egress.http_parts import HOP_BY_HOP, authority, closes, header, origin_form
from sandhold.egress.refusal import refused
from sandhold.egress.secrets import Injection


class Redactor:
    """Blanks the bare secret values out of a response stream (same length, so framing and
    Content-Length stay right), keeping a tail back in case a value spans two chunks."""

    def __init__(self, values: list[bytes]) -> None:
        self.values = [v for v in values if len(v) >= 4]
        self.keep = max((len(v) for v in self.values), default=1) - 1
        self.buf = b""

    def feed(self, data: bytes) -> bytes:
        if not self.values:
            return data
        buf = self.buf + data
        for v in self.values:
            buf = buf.replace(v, b"*" * len(v))
        cut = max(len(buf) - self.keep, 0)
        self.buf = buf[cut:]
        return buf[:cut]

    def flush(self) -> bytes:
        out, self.buf = self.buf, b""
        return out


def redact_header(value: bytes, redact: Redactor) -> bytes:
    for v in redact.values:
        value = value.replace(v, b"*" * len(v))
    return value


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
    req: h11.Request, target: Target, tls: bool, injections: list[Injection]
) -> list[tuple[bytes, bytes]]:
    """The request's end-to-end headers, with the Host of the checked target, the credential in
    place of any header of that name, exactly one framing header, and ``Connection: close``."""
    replaced = {i.header.lower().encode() for i in injections}
    headers = [
        (k, v)
        for k, v in req.headers
        if k.lower() not in HOP_BY_HOP and k.lower() != b"host" and k.lower() not in replaced
    ]
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
    """One request upstream and its response back; the credential is added here (TLS only,
    never over plain HTTP) and blanked out of what comes back."""
    injections = c.shared.injections(c.sbx, target.host) if tls else []
    headers = _upstream_headers(req, target, tls, injections)
    up_reader, up_writer = await c.dial(target, tls=tls)
    up = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    sent = received = 0
    status = 0
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
        redact = Redactor([i.raw for i in injections])
        while True:
            try:
                ev = await c.event(up, up_reader)
            except h11.RemoteProtocolError as e:
                raise refused(
                    502, f"invalid response from {target.host}: {e}", "upstream"
                ) from None
            if isinstance(ev, h11.InformationalResponse):
                continue
            if isinstance(ev, h11.Response):
                break
            raise refused(502, f"{target.host} closed the connection", "upstream")
        status = ev.status_code
        resp_headers = [
            (k, redact_header(v, redact))
            for k, v in ev.headers
            if k.lower() not in HOP_BY_HOP or k.lower() in (b"content-length", b"transfer-encoding")
        ]
        keep = keep_alive and conn.their_http_version == b"1.1" and not closes(req.headers)
        if not keep:
            resp_headers.append((b"Connection", b"close"))
        c.writer.write(
            conn.send(h11.Response(status_code=status, headers=resp_headers, reason=ev.reason))
            or b""
        )
        while True:
            ev = await c.event(up, up_reader)
            if isinstance(ev, h11.Data):
                received += len(ev.data)
                out = redact.feed(ev.data)
                if out:
                    c.writer.write(conn.send(h11.Data(data=out)) or b"")
                    await c.writer.drain()
            elif isinstance(ev, h11.EndOfMessage):
                tail = redact.flush()
                if tail:
                    c.writer.write(conn.send(h11.Data(data=tail)) or b"")
                c.writer.write(conn.send(h11.EndOfMessage()) or b"")
                await c.writer.drain()
                break
            else:
                break
    finally:
        up_writer.close()
        c.record(
            kind="mitm" if tls else "http",
            method=req.method.decode(),
            host=target.host,
            port=target.port,
            path=origin_form(req.target).decode("ascii", "replace"),
            status=status,
            bytes_out=sent,
            bytes_in=received,
            decision="allow",
            rule=target.decision.rule,
            injected=[i.secret for i in injections] or None,
            duration_ms=round((time.monotonic() - started) * 1e3, 2),
        )
