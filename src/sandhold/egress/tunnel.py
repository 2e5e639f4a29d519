"""A ``CONNECT`` tunnel to a host without a credential rule: spliced through untouched, once the
TLS ClientHello's server name (if there is one) was checked against the CONNECT host."""

from __future__ import annotations

import asyncio
import time

import h11

from sandhold.egress.connection import CHUNK, Connection, Target
from sandhold.egress.refusal import refused
from sandhold.errors import EgressRefused

CLIENT_HELLO_MAX = 16 * 1024


async def tunnel(
    c: Connection, conn: h11.Connection, target: Target, authority: str, started: float
) -> None:
    host, port = target.host, target.port
    up_reader, up_writer = await c.dial(target)
    c.writer.write(
        conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection established"))
        or b""
    )
    data, _closed = conn.trailing_data
    counts = [0, 0]
    status = 200
    try:
        first = await _client_hello(c, data)
        name = sni(first)
        if name is not None and name.rstrip(".").lower() != host:
            status = 403
            raise refused(
                403, f"TLS server name {name!r} does not match the tunnel to {host}", "sni"
            )
        up_writer.write(first)
        counts[0] += len(first)
        await _splice((c.reader, c.writer), (up_reader, up_writer), counts)
    except EgressRefused as e:
        c.record(
            kind="connect",
            method="CONNECT",
            host=host,
            port=port,
            path=authority,
            status=403,
            decision="deny",
            rule=e.rule,
            reason=e.message,
        )
        up_writer.close()
        return
    finally:
        up_writer.close()
        if status == 200:
            c.record(
                kind="connect",
                method="CONNECT",
                host=host,
                port=port,
                path=authority,
                status=200,
                bytes_out=counts[0],
                bytes_in=counts[1],
                decision="allow",
                rule=target.decision.rule,
                duration_ms=round((time.monotonic() - started) * 1e3, 2),
            )


async def _client_hello(c: Connection, data: bytes) -> bytes:
    """The client's first bytes: the whole first TLS record if it starts one, else what came
    (a client of a protocol where the server speaks first sends nothing: give up waiting)."""
    buf = data
    try:
        while True:
            if buf and buf[0] != 0x16:
                return buf
            if len(buf) >= 5:
                need = 5 + int.from_bytes(buf[3:5], "big")
                if len(buf) >= need or len(buf) >= CLIENT_HELLO_MAX:
                    return buf
            chunk = await asyncio.wait_for(c.reader.read(CHUNK), 0.5 if not buf else 10)
            if not chunk:
                return buf
            buf += chunk
    except TimeoutError:
        return buf


def sni(data: bytes) -> str | None:
    """The server name of a TLS ClientHello (None if ``data`` is not one or has none)."""
    try:
        if len(data) < 9 or data[0] != 0x16 or data[5] != 0x01:
            return None
        p = 9 + 2 + 32  # record header, handshake header, version, random
        p += 1 + data[p]  # session id
        p += 2 + int.from_bytes(data[p : p + 2], "big")  # cipher suites
        p += 1 + data[p]  # compression methods
        end = p + 2 + int.from_bytes(data[p : p + 2], "big")
        p += 2
        while p + 4 <= min(end, len(data)):
            etype = int.from_bytes(data[p : p + 2], "big")
            elen = int.from_bytes(data[p + 2 : p + 4], "big")
            if etype == 0:
                q = p + 4 + 2
                while q + 3 <= p + 4 + elen:
                    ntype, nlen = data[q], int.from_bytes(data[q + 1 : q + 3], "big")
                    if ntype == 0:
                        return data[q + 3 : q + 3 + nlen].decode("ascii", "replace")
                    q += 3 + nlen
                return None
            p += 4 + elen
    except IndexError:
        return None
    return None


async def _copy(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counts: list[int], i: int
) -> None:
    try:
        while data := await reader.read(CHUNK):
            counts[i] += len(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def _splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    counts: list[int],
) -> None:
    try:
        await asyncio.gather(_copy(a[0], b[1], counts, 0), _copy(b[0], a[1], counts, 1))
    finally:
        a[1].close()
        b[1].close()
