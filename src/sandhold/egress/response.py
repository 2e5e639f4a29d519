"""The way back: an upstream's response, relayed toward the sandbox with every credential in
scope of the exchange blanked out of everything that crosses (``scan.Scanner``).

- The status line's reason phrase, every header name and value: scanned.
- Informational (1xx) responses and trailers: never forwarded (the proxy answers ``100
  Continue`` itself; h11 re-frames the body, so chunk extensions do not cross either).
- The body: scanned as a stream, across chunk and read boundaries; one that arrives compressed
  although the proxy asked for identity is decoded first (``decoding``) and forwarded decoded,
  one in a coding it cannot decode is refused (502).
- Errors: what the proxy says about a broken response never quotes it (h11's messages do), and a
  body that turns out broken half-way cuts the connection instead of being answered into.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import h11

from sandhold.egress.connection import Connection, Target
from sandhold.egress.decoding import Decoder, decoder_for
from sandhold.egress.http_parts import HOP_BY_HOP
from sandhold.egress.refusal import refused
from sandhold.egress.scan import Scanner
from sandhold.errors import EgressRefused

log = logging.getLogger("sandhold.egress")
_FRAMING = (b"content-length", b"transfer-encoding")


@dataclass
class Relayed:
    status: int = 0
    received: int = 0  # bytes of body from the upstream, as they came
    note: str | None = None  # for the audit log: what was blanked, or why the body was cut


async def relay(
    c: Connection,
    conn: h11.Connection,
    up: h11.Connection,
    up_reader: asyncio.StreamReader,
    target: Target,
    scanner: Scanner,
    keep_alive: bool,
) -> Relayed:
    """Relay one response; the result says what happened. A refusal is raised only before
    anything was written toward the sandbox."""
    res = Relayed()
    ev = await _head(c, up, up_reader, target, scanner)
    res.status = ev.status_code
    decoder = decoder_for(ev.headers, target.host) if scanner else None
    headers = _headers(ev.headers, scanner, decoder is not None)
    if not keep_alive:
        headers.append((b"Connection", b"close"))
    c.writer.write(
        conn.send(
            h11.Response(
                status_code=ev.status_code, headers=headers, reason=scanner.blank(ev.reason)
            )
        )
        or b""
    )
    try:
        await _body(c, conn, up, up_reader, target, scanner, decoder, res)
    except EgressRefused as e:  # too late to answer: the sandbox sees the connection cut
        res.note = f"response body cut: {e.message}"
    if scanner.blanked:
        blanked = f"blanked {scanner.blanked} reflection(s) of a credential"
        res.note = blanked if res.note is None else f"{res.note}; {blanked}"
        log.warning("sandbox %s: %s %s", c.sbx.id, target.host, blanked)
    return res


async def _head(
    c: Connection,
    up: h11.Connection,
    up_reader: asyncio.StreamReader,
    target: Target,
    scanner: Scanner,
) -> h11.Response:
    while True:
        try:
            ev = await c.event(up, up_reader)
        except h11.RemoteProtocolError as e:
            # h11 quotes the offending line, which may hold a credential
            detail = "" if scanner else f": {e}"
            raise refused(502, f"invalid response from {target.host}{detail}", "upstream") from None
        if isinstance(ev, h11.InformationalResponse):
            continue
        if isinstance(ev, h11.Response):
            return ev
        raise refused(502, f"{target.host} closed the connection", "upstream")


def _headers(
    headers: Iterable[tuple[bytes, bytes]], scanner: Scanner, decoded: bool
) -> list[tuple[bytes, bytes]]:
    out = []
    for k, v in headers:
        name = k.lower()
        if name in HOP_BY_HOP and name not in _FRAMING:
            continue
        if decoded and name in (b"content-encoding", b"content-length"):
            continue
        if decoded and name == b"etag" and not v.startswith(b"W/"):
            v = b"W/" + v  # the decoded body is another representation
        out.append((scanner.blank(k), scanner.blank(v)))
    return out


async def _body(
    c: Connection,
    conn: h11.Connection,
    up: h11.Connection,
    up_reader: asyncio.StreamReader,
    target: Target,
    scanner: Scanner,
    decoder: Decoder | None,
    res: Relayed,
) -> None:
    redact = scanner.stream()

    async def send(pieces: Iterable[bytes]) -> None:
        for piece in pieces:
            out = redact.feed(piece)
            if out:
                c.writer.write(conn.send(h11.Data(data=out)) or b"")
                await c.writer.drain()
            if decoder is not None:
                await asyncio.sleep(0)  # a bomb must not hold the loop

    while True:
        try:
            ev = await c.event(up, up_reader)
        except h11.RemoteProtocolError:
            raise refused(502, f"{target.host} sent an invalid response body", "upstream") from None
        if isinstance(ev, h11.Data):
            res.received += len(ev.data)
            await send(decoder.feed(ev.data) if decoder else (ev.data,))
        elif isinstance(ev, h11.EndOfMessage):  # its trailers are dropped
            if decoder is not None:
                await send(decoder.finish())
            tail = redact.flush()
            if tail:
                c.writer.write(conn.send(h11.Data(data=tail)) or b"")
            c.writer.write(conn.send(h11.EndOfMessage()) or b"")
            await c.writer.drain()
            return
        else:
            return
