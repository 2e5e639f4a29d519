"""A client of one sandbox on this host, over its agent's unix socket: the envd client
(``sandhold.envd.client``) with a socket of its own, for the CLI, tests and benchmarks, which
talk to a sandbox without any HTTP server in between."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx

from sandhold.envd import ENVD_PORT
from sandhold.envd.client import CommandOutput, EnvdClient
from sandhold.envd.transports import Channel, agent_transport


class AgentClient(EnvdClient):
    def __init__(self, socket_path: Path | str, timeout: float | None = 60.0) -> None:
        client = httpx.AsyncClient(transport=agent_transport(socket_path), timeout=timeout)
        super().__init__(Channel(client, f"http://127.0.0.1:{ENVD_PORT}"))

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.ch.client.aclose()


__all__ = ["AgentClient", "CommandOutput"]


T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end from sync code, whether or not this thread runs an event loop.
    Interrupted (Ctrl-C in the CLI), it does not wait for ``coro``: the caller's cleanup (the
    build sandbox's kill) ends it."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(asyncio.run, coro).result()
    finally:
        pool.shutdown(wait=False)


def read_status(s: socket.socket) -> int:
    """The status code of the response head read from ``s`` (its whole head consumed)."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            return 0
        head += chunk
    parts = head.split(b"\r\n", 1)[0].split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
