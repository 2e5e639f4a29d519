"""Kept-alive connections from the data plane to the sandboxes' agents (envd's port only).

A request to envd used to connect to the agent's socket and close the connection after the
answer; the agent serves HTTP/1.1 keep-alive, and reusing a connection whose last exchange ended
cleanly saves the connect, the agent's accept and both closes: ``commands.run("true")`` through
the SDK 4.45 → 4.10 ms p50 on this host (interleaved A/B, docs/benchmarks.md).

A connection the agent closed is never reused: the agent closes every connection when it
quiesces for a checkpoint (suspend to disk, snapshot, fork) and a dead agent's are at EOF, which
the event loop sees on an idle connection; a checkout skips them. Idle connections are bounded
per socket and in all (the least recently used go first), so a killed sandbox's leave soon.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

PER_SOCKET = 4  # idle connections kept per agent
TOTAL = 512  # idle connections kept in all

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class AgentConnections:
    def __init__(self, read_limit: int) -> None:
        self.read_limit = read_limit
        self._idle: OrderedDict[str, list[Streams]] = OrderedDict()
        self._count = 0

    async def checkout(self, socket_path: str) -> Streams:
        """An idle connection to the agent at ``socket_path``, else a new one (OSError if none
        can be made)."""
        idle = self._idle.get(socket_path)
        while idle:
            reader, writer = idle.pop()
            self._count -= 1
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
            writer.close()
        self._idle.pop(socket_path, None)
        return await asyncio.open_unix_connection(socket_path, limit=self.read_limit)

    def checkin(self, socket_path: str, streams: Streams) -> None:
        """Keep a connection whose exchange ended cleanly for the next request."""
        reader, writer = streams
        idle = self._idle.get(socket_path, [])
        if writer.is_closing() or reader.at_eof() or len(idle) >= PER_SOCKET:
            writer.close()  # (and no entry made for it: a gone sandbox's would stay)
            return
        self._idle[socket_path] = idle
        self._idle.move_to_end(socket_path)
        idle.append(streams)
        self._count += 1
        while self._count > TOTAL:
            _, oldest = next(iter(self._idle.items()))
            if oldest:
                oldest.pop(0)[1].close()
                self._count -= 1
            else:
                self._idle.popitem(last=False)

    def close(self) -> None:
        for idle in self._idle.values():
            for _reader, writer in idle:
                writer.close()
        self._idle.clear()
        self._count = 0
