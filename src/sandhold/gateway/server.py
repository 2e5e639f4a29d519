"""Running the gateway: ``sandhold gateway serve`` (REST + MCP over HTTP, uvicorn) and
``sandhold gateway mcp`` (MCP over stdio)."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import uvicorn

from sandhold.config import Settings
from sandhold.errors import NotFound
from sandhold.gateway.app import Gateway
from sandhold.gateway.mcp_server import SESSION_HEADER, build_mcp
from sandhold.gateway.policy import SESSION_ID_RE, check_id
from sandhold.gateway.rest import build_app
from sandhold.listening import listening_host, no_delay
from sandhold.logs import RequestLog
from sandhold.logs.context import Ids


def _quiet() -> None:
    # one INFO line per provider request drowns everything else
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _gateway(settings: Settings) -> Gateway:
    """The gateway, once the settings pass the checks of a serving gateway."""
    gw = Gateway(settings)
    settings.check_gateway_serve(gw.provider.name, gw.provider.capabilities.mount_workspace)
    return gw


def _session_of_path(scope: dict[str, Any], ids: Ids) -> None:
    """A REST request's session, from its path (``/v1/sessions/<id>/...``), for its log line
    and every record logged while it runs; MCP requests name theirs in a header."""
    parts = scope.get("path", "").split("/")
    if len(parts) > 3 and parts[1:3] == ["v1", "sessions"] and SESSION_ID_RE.match(parts[3]):
        ids.session = parts[3]
    else:
        for key, value in scope.get("headers", []):
            if key == SESSION_HEADER.encode() and SESSION_ID_RE.match(value.decode("latin-1")):
                ids.session = value.decode("latin-1")


def serve(settings: Settings, fd: int | None = None) -> None:
    """Serve on ``gateway_host:gateway_port``, or on the inherited listening socket ``fd``."""
    _quiet()
    if fd is not None:
        listening_host(fd)  # refuses anything but a listening stream socket
        no_delay(fd)
    config = uvicorn.Config(
        RequestLog(build_app(_gateway(settings)), identify=_session_of_path),
        host=settings.gateway_host,
        port=settings.gateway_port,
        fd=fd,
        http="httptools",
        loop="asyncio",
        lifespan="on",
        access_log=False,
        log_config=None,  # uvicorn's loggers propagate to sandhold.logs' handlers
        timeout_graceful_shutdown=5,
        log_level="info",
    )
    uvicorn.Server(config).run()


def serve_stdio(settings: Settings, tenant_id: str, session_id: str | None) -> None:
    """One MCP client on stdin/stdout, for a tenant (and session) fixed by the operator."""
    _quiet()
    if session_id is not None:
        check_id(session_id, "session id", SESSION_ID_RE)
    gw = _gateway(settings)

    async def identity(ctx: Any) -> tuple[str, str | None]:
        return tenant_id, session_id

    async def main() -> None:
        async with gw.running():
            if await anyio.to_thread.run_sync(gw.store.get_tenant, tenant_id) is None:
                raise NotFound(f"tenant {tenant_id!r} does not exist")
            await build_mcp(gw.tools, identity, gw.tunnels).run_stdio_async()

    anyio.run(main)
