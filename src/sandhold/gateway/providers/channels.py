"""Pooled HTTP clients to the sandboxes of this host, one per sandbox and port.

A tool call used to open a client (and a connection to the agent's socket) of its own; the
agent answers a command on a kept-alive connection ~2.5 ms sooner on this host. A connection
that its agent closed (a sandbox suspended to disk closes all of them, a dead agent leaves
them at EOF) is not reused: the pool sees it closed when it checks it out, and connects again,
which fails as ``SandboxGone`` when nothing accepts any more (``AgentSocketTransport``).

Clients are closed when their sandbox is killed through the provider, when it turns out gone,
and at close; past ``MAX_CLIENTS`` the least recently used idle ones are closed too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import httpx

from sandhold.envd.transports import Channel, agent_transport

MAX_CLIENTS = 2048


class Channels:
    def __init__(self) -> None:
        # (sandbox id, port) -> (client, socket path, requests in flight)
        self._clients: OrderedDict[tuple[str, int], tuple[httpx.AsyncClient, Path, int]] = (
            OrderedDict()
        )
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._clients)

    @contextlib.contextmanager
    def get(self, sandbox_id: str, socket_path: Path, port: int) -> Iterator[Channel]:
        """A channel to ``port`` of the sandbox whose agent listens at ``socket_path``."""
        key = (sandbox_id, port)
        got = self._clients.get(key)
        if got is None or got[1] != socket_path:
            if got is not None:
                self._close_later(got[0])
            got = (
                httpx.AsyncClient(transport=agent_transport(socket_path, port), timeout=None),
                socket_path,
                0,
            )
        client = got[0]
        self._clients[key] = (client, socket_path, got[2] + 1)
        self._clients.move_to_end(key)
        self._evict()
        try:
            yield Channel(client, f"http://127.0.0.1:{port}")
        finally:
            now = self._clients.get(key)
            if now is not None and now[0] is client:
                self._clients[key] = (client, socket_path, now[2] - 1)

    async def drop(self, sandbox_id: str) -> None:
        """Close the sandbox's clients (it is gone)."""
        for key in [k for k in self._clients if k[0] == sandbox_id]:
            client, _path, _busy = self._clients.pop(key)
            await client.aclose()

    async def close(self) -> None:
        clients = [c for c, _p, _b in self._clients.values()]
        self._clients.clear()
        for client in clients:
            await client.aclose()
        await asyncio.gather(*self._closing, return_exceptions=True)

    def _evict(self) -> None:
        """Close the least recently used idle clients past MAX_CLIENTS (one in use stays)."""
        if len(self._clients) <= MAX_CLIENTS:
            return
        for key in list(self._clients):
            if len(self._clients) <= MAX_CLIENTS:
                break
            client, _path, busy = self._clients[key]
            if busy == 0:
                del self._clients[key]
                self._close_later(client)

    def _close_later(self, client: httpx.AsyncClient) -> None:
        task = asyncio.get_running_loop().create_task(client.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
