"""Whole requests from the edge to a host, over the edge's kept connections to it
(e2b/agent_conns.py): the control calls about one sandbox and creates, whose answer the edge
reads (and writes in the catalog) before the caller hears it.

h11 on a kept connection rather than a general HTTP client: a create through the edge cost
about 3 ms more with httpx here (bench/fleet_bench.py, docs/benchmarks.md "The fleet").
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import h11

from sandhold.e2b.agent_conns import AgentConnections
from sandhold.e2b.proxy import READ_CHUNK

CONNECT_TIMEOUT_S = 5.0  # to a host: one that takes longer is not answering


@dataclass(frozen=True)
class Answer:
    status_code: int
    headers: dict[str, str]  # names in lower case
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


async def call(
    conns: AgentConnections,
    key: str,
    method: str,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    timeout: float,
) -> Answer:
    """``method target`` with ``headers`` (none that frame a body) and ``body`` to the host at
    ``key`` (``host:port``); its whole answer. OSError if the connection fails (before or
    after the host got the request), TimeoutError past ``timeout`` (or CONNECT_TIMEOUT_S
    without a connection)."""
    streams = await asyncio.wait_for(conns.checkout(key), CONNECT_TIMEOUT_S)
    reader, writer = streams
    conn = h11.Connection(h11.CLIENT)
    clean = False
    try:
        async with asyncio.timeout(timeout):
            framing = [(b"content-length", str(len(body)).encode())]
            request = h11.Request(method=method, target=target, headers=[*headers, *framing])
            writer.write(conn.send(request) + conn.send(h11.Data(data=body)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            status, got, chunks = 0, {}, []
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(READ_CHUNK))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    got = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    raise ConnectionResetError("the host closed the connection")
        clean = conn.our_state is h11.DONE and conn.their_state is h11.DONE
        return Answer(status, got, b"".join(chunks))
    except h11.ProtocolError as e:
        raise ConnectionResetError(f"the host's answer does not parse: {e}") from None
    finally:
        if clean:
            conns.checkin(key, streams)
        else:
            writer.close()
