"""The data plane's kept-alive connections to agents (e2b/agent_conns.py), on a real unix
socket server: a clean connection is reused, one its server closed is not, and idle ones are
bounded per socket and in all."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandhold.e2b import agent_conns
from sandhold.e2b.agent_conns import AgentConnections


class Server:
    def __init__(self) -> None:
        self.accepted = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
        writer.close()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[Server, str]]:
    srv = Server()
    path = str(tmp_path / "agent.sock")
    unix = await asyncio.start_unix_server(srv.on_connect, path)
    yield srv, path
    unix.close()
    for w in srv.writers:
        w.close()
    await unix.wait_closed()
    await asyncio.sleep(0.05)


async def echo(streams: tuple[asyncio.StreamReader, asyncio.StreamWriter], text: bytes) -> bytes:
    reader, writer = streams
    writer.write(text + b"\n")
    await writer.drain()
    return await reader.readline()


async def test_a_clean_connection_is_reused_and_a_closed_one_is_not(server) -> None:
    srv, path = server
    pool = AgentConnections(65536)
    first = await pool.checkout(path)
    assert await echo(first, b"a") == b"a\n"
    pool.checkin(path, first)
    again = await pool.checkout(path)
    assert again[1] is first[1] and srv.accepted == 1
    pool.checkin(path, again)
    for w in srv.writers:  # the agent quiesces: every connection closed
        w.close()
    await asyncio.sleep(0.05)  # (the loop reads the EOF on the idle connection)
    fresh = await pool.checkout(path)
    assert await echo(fresh, b"b") == b"b\n"
    assert fresh[1] is not first[1] and srv.accepted == 2
    fresh[1].close()
    pool.close()
    await asyncio.sleep(0.05)


async def test_idle_connections_are_bounded(server, monkeypatch) -> None:
    _srv, path = server
    monkeypatch.setattr(agent_conns, "TOTAL", 3)
    pool = AgentConnections(65536)
    held = [await pool.checkout(path) for _ in range(agent_conns.PER_SOCKET + 2)]
    for streams in held:
        pool.checkin(path, streams)
    await asyncio.sleep(0.05)
    kept = [s for s in held if not s[1].is_closing()]
    assert len(kept) == 3  # (per socket 4, in all 3: the oldest went first)
    assert [s[1] for s in kept] == [s[1] for s in held[-3:]]
    pool.close()
    assert all(s[1].is_closing() for s in held)
    await asyncio.sleep(0.05)
    with pytest.raises(OSError):
        await pool.checkout(path + ".missing")


async def test_an_idle_connection_is_closed_when_its_agent_goes(server) -> None:
    """No checkout needed: the agent's EOF closes the idle connection and it is forgotten (a
    killed sandbox's would otherwise hold a descriptor until pushed out)."""
    srv, path = server
    pool = AgentConnections(65536)
    streams = await pool.checkout(path)
    assert await echo(streams, b"a") == b"a\n"
    pool.checkin(path, streams)
    for w in srv.writers:
        w.close()
    for _ in range(100):
        if streams[1].is_closing():
            break
        await asyncio.sleep(0.01)
    assert streams[1].is_closing() and pool._count == 0 and not pool._idle
    pool.close()
