"""Kept-alive connections from the data plane to the sandboxes' agents (envd's port only).

A request to envd used to connect to the agent's socket and close the connection after the
answer; the agent serves HTTP/1.1 keep-alive, and reusing a connection whose last exchange ended
cleanly saves the connect, the agent's accept and both closes: ``commands.run("true")`` through
the SDK 4.45 → 4.10 ms p50 on this host (interleaved A/B, docs/benchmarks.md).

A connection the agent closed is never reused, nor kept: the agent closes every connection when
it quiesces for a checkpoint (suspend to disk, snapshot, fork), and a killed sandbox's agent is
gone; each idle connection has a watcher that closes it (and forgets it) at the agent's EOF,
else a killed sandbox's would hold a descriptor until pushed out (asyncio leaves a stream
half-open at EOF). Idle connections are bounded per socket and in all (the least recently used
go first).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

PER_SOCKET = 4  # idle connections kept per agent
TOTAL = 512  # idle connections kept in all

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_Idle = tuple[Streams, "asyncio.Future[None]"]  # a connection and its EOF watcher


class AgentConnections:
    """Keyed by the agent's socket path; ``opener`` opens a new connection for a key instead
    (a fleet's edge keeps its connections to hosts here, keyed by ``host:port``)."""

    def __init__(
        self, read_limit: int, opener: Callable[[str], Awaitable[Streams]] | None = None
    ) -> None:
        self.read_limit = read_limit
        self._open = opener or self._open_unix
        self._idle: OrderedDict[str, list[_Idle]] = OrderedDict()
        self._count = 0

    async def checkout(self, socket_path: str) -> Streams:
        """An idle connection to the agent at ``socket_path``, else a new one (OSError if none
        can be made)."""
        idle = self._idle.get(socket_path)
        while idle:
            streams, watcher = idle.pop()
            self._count -= 1
            watcher.cancel()
            await asyncio.wait({watcher})  # its read ended: the reader is free again
            reader, writer = streams
            if not watcher.cancelled() or writer.is_closing() or reader.at_eof():
                writer.close()  # EOF, or bytes nobody asked for: not a clean connection
                continue
            if not idle:
                self._idle.pop(socket_path, None)
            return streams
        self._idle.pop(socket_path, None)
        return await self._open(socket_path)

    async def _open_unix(self, socket_path: str) -> Streams:
        return await asyncio.open_unix_connection(socket_path, limit=self.read_limit)

    def checkin(self, socket_path: str, streams: Streams) -> None:
        """Keep a connection whose exchange ended cleanly for the next request."""
        reader, writer = streams
        idle = self._idle.get(socket_path, [])
        if writer.is_closing() or reader.at_eof() or len(idle) >= PER_SOCKET:
            writer.close()  # and no entry made for it: a gone sandbox's would stay
            return
        self._idle[socket_path] = idle
        self._idle.move_to_end(socket_path)
        entry: _Idle = (streams, asyncio.ensure_future(self._until_eof(socket_path, streams)))
        idle.append(entry)
        self._count += 1
        while self._count > TOTAL:
            _, oldest = next(iter(self._idle.items()))
            if oldest:
                self._drop(oldest.pop(0))
            else:
                self._idle.popitem(last=False)

    async def _until_eof(self, socket_path: str, streams: Streams) -> None:
        """An idle connection's watcher: it ends (cancelled) at checkout, or reads the agent's
        EOF and closes the connection, which is forgotten."""
        await streams[0].read(1)
        idle = self._idle.get(socket_path, [])
        for entry in idle:
            if entry[0] is streams:
                idle.remove(entry)
                self._count -= 1
                break
        if not idle:
            self._idle.pop(socket_path, None)
        streams[1].close()

    def _drop(self, entry: _Idle) -> None:
        entry[1].cancel()
        entry[0][1].close()
        self._count -= 1

    def close(self) -> None:
        for idle in self._idle.values():
            for entry in idle:
                entry[1].cancel()
                entry[0][1].close()
        self._idle.clear()
        self._count = 0
