"""A tenant's tunnel tools on the gateway's surfaces: listed next to the built-in tools (MCP
``tools/list``, REST ``GET /v1/tools`` with the tenant's key), called through the tunnel (MCP
``tools/call``, REST ``POST /v1/sessions/{id}/tools/<tunnel>__<tool>``), each call written to the
session's timeline as a ``tunnel_call`` event (duration, outcome, sizes; never a token).

Only the caller's tenant's tunnels are looked at, so another tenant's tools are neither listed
nor callable. A tunnel call needs no sandbox: it opens the session (a row, for the timeline)
but creates none.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types

from sandhold.config import Settings
from sandhold.errors import (
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    SandholdError,
    SessionClosed,
    Unauthenticated,
)
from sandhold.gateway.errors import mcp_retryable
from sandhold.gateway.policy import SESSION_ID_RE, check_id
from sandhold.gateway.timeline import Timeline
from sandhold.store.db import Store
from sandhold.tunnel.client import SEP, TunnelClient, is_tunnel_tool
from sandhold.tunnel.registry import Registry
from sandhold.tunnel.relay import Relay

EVENT = "tunnel_call"


class TunnelTools:
    def __init__(self, settings: Settings, store: Store, timeline: Timeline, replica: str) -> None:
        self.settings = settings
        self.store = store
        self.timeline = timeline
        self.registry = Registry(settings, store)
        self.relay = Relay(settings, store, self.registry, replica)
        self.client = TunnelClient(self.relay, self.registry)

    is_tunnel_tool = staticmethod(is_tunnel_tool)

    async def tools(self, tenant_id: str) -> dict[str, dict[str, Any]]:
        """The tenant's tunnel tools now, by exposed name (tunnels without a live connector
        offer none)."""
        tunnels = await asyncio.to_thread(self.registry.list, tenant_id)
        return await self.client.tools_of(tunnels)

    async def schemas(self, tenant_id: str) -> list[dict[str, Any]]:
        """As ``GET /v1/tools`` lists the built-in ones."""
        return [
            {
                "name": name,
                "description": e["tool"].get("description") or "",
                "input_schema": e["tool"].get("inputSchema") or {"type": "object"},
                "tunnel": name.split(SEP, 1)[0],
                "channel": e["channel"],
            }
            for name, e in sorted((await self.tools(tenant_id)).items())
        ]

    async def _open_session(self, tenant_id: str, session_id: str) -> None:
        row = await asyncio.to_thread(self.store.get_session, tenant_id, session_id)
        if row is None:
            ttl = self.settings.gateway_lock_ttl_s
            opened, token, created = await asyncio.to_thread(
                self.store.open_and_lock, tenant_id, session_id, ttl
            )
            if token is not None:
                await asyncio.to_thread(self.store.unlock, opened.pk, token)
            if created:
                await self.timeline.record(tenant_id, session_id, "session_opened")
            row = opened
        if row.state == "closed":
            raise SessionClosed(f"session {session_id!r} is closed")

    async def call(
        self, tenant_id: str, session_id: str | None, name: str, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        """Call the tunnel tool ``name`` for the tenant's session; the MCP ``CallToolResult``
        as JSON (a tool error of the internal server is ``isError``, not an exception)."""
        arguments = dict(arguments)
        sid = arguments.pop("session_id", None) or session_id
        if sid is None:
            raise InvalidRequest("no session: pass session_id or connect with a session")
        check_id(sid, "session id", SESSION_ID_RE)
        tunnel_name = name.split(SEP, 1)[0]
        tunnel = await asyncio.to_thread(self.registry.by_name, tenant_id, tunnel_name)
        if tunnel is None:
            raise NotFound(f"unknown tool {name!r}: the tenant has no tunnel {tunnel_name!r}")
        bytes_in = len(json.dumps(arguments))
        if bytes_in > self.settings.gateway_tunnel_max_request_bytes:
            raise _too_large(bytes_in, self.settings.gateway_tunnel_max_request_bytes)
        await self._open_session(tenant_id, sid)
        t0 = time.monotonic()
        result: dict[str, Any] = {}
        error: SandholdError | None = None
        entry: dict[str, Any] = {}
        try:
            result, entry = await self.client.call(tunnel, name, arguments)
            return result
        except SandholdError as e:
            error = e
            raise
        finally:
            outcome = "error" if error else "tool_error" if result.get("isError") else "ok"
            where = (
                f"tunnel {tunnel.name} ({tunnel.id}), channel {entry.get('channel', '?')}, "
                f"tool {entry.get('tool', {}).get('name', name)}: {outcome}"
            )
            await self.timeline.record(
                tenant_id,
                sid,
                EVENT,
                tool=name[:32],
                duration_ms=round((time.monotonic() - t0) * 1000, 2),
                bytes_in=bytes_in,
                bytes_out=len(json.dumps(result)) if result else None,
                error=f"{error.code}: {error.message}" if error else None,
                reason=where,
            )

    # -- the MCP surface -----------------------------------------------------------------------
    def attach(
        self,
        server: Any,
        identity: Callable[[Any], Awaitable[tuple[str, str | None]]],
    ) -> None:
        """Wrap the MCP server's tools/list and tools/call: the built-in tools stay as they are,
        the caller's tunnel tools are added (``server``: an ``MCPServer``)."""
        from mcp.server.mcpserver import Context

        # The SDK has no public way to its low-level server's handlers (mcp's MCPServer keeps
        # it private): wrapping tools/list and tools/call needs them.
        low = server._lowlevel_server  # noqa: SLF001
        list_entry = low.get_request_handler("tools/list")
        call_entry = low.get_request_handler("tools/call")

        async def who(ctx: Any) -> tuple[str, str | None] | None:
            try:
                return await identity(Context(request_context=ctx, mcp_server=server))
            except Unauthenticated:
                return None

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            builtin = await list_entry.handler(ctx, params)
            ident = await who(ctx)
            if ident is None:
                return builtin  # type: ignore[no-any-return]
            extra = []
            for name, e in sorted((await self.tools(ident[0])).items()):
                tool = e["tool"]
                extra.append(
                    types.Tool(
                        name=name,
                        description=tool.get("description"),
                        input_schema=tool.get("inputSchema") or {"type": "object"},
                        annotations=tool.get("annotations"),
                    )
                )
            return types.ListToolsResult(tools=[*builtin.tools, *extra])

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
            if not is_tunnel_tool(params.name):
                return await call_entry.handler(ctx, params)
            try:
                ident = await identity(Context(request_context=ctx, mcp_server=server))
                result = await self.call(
                    ident[0], ident[1], params.name, dict(params.arguments or {})
                )
            except SandholdError as e:
                text = json.dumps(
                    {"code": e.code, "message": e.message, "retryable": mcp_retryable(e)}
                )
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=text)], is_error=True
                )
            return types.CallToolResult.model_validate(result)

        low.add_request_handler("tools/list", list_entry.params_type, list_tools)
        low.add_request_handler("tools/call", call_entry.params_type, call_tool)


def _too_large(size: int, limit: int) -> SandholdError:
    return PayloadTooLarge(
        f"the tool call's arguments are {size} bytes, more than a tunnel "
        f"carries ({limit}, gateway_tunnel_max_request_bytes)"
    )
