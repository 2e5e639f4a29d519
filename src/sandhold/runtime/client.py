"""A client of one sandbox on this host, over its agent's unix socket: the envd client
(``sandhold.envd.client``) with a socket of its own, for the CLI, tests and benchmarks, which
talk to a sandbox without any HTTP server in between."""

from __future__ import annotations

from pathlib import Path

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
