"""The gateway as an MCP client of the servers behind a tunnel, of either era, per channel: first
``server/discover`` (MCP 2026-07-28, stateless: every request then carries its ``_meta``
envelope and the ``Mcp-Protocol-Version``, ``Mcp-Method`` and ``Mcp-Name`` headers), else, for a
server that does not know it, the initialize handshake (its ``Mcp-Session-Id`` kept per
replica); ``tools/list`` cached briefly (and served stale while a new one is fetched),
``tools/call``.

The messages are plain JSON-RPC, as MCP's streamable HTTP transport carries them, because the
connector forwards them verbatim (ours, and OpenAI's tunnel-client alike).

Tool names: a tunnel ``corp`` offers the tool ``lookup`` of its ``main`` channel as
``corp__lookup``, and that of another channel ``hr`` as ``corp__hr__lookup``. A tunnel's name has
no ``_`` and no built-in tool has ``__``, so no tunnel tool can take a built-in's name or another
tunnel's; a name that would still collide (``a__b`` of main vs ``b`` of channel ``a``), or that
is not ``[A-Za-z0-9_-]{1,64}`` (what model APIs accept), is refused and logged. So is a tool
that is not a valid MCP tool (a description that is not a string, a schema that is not an
object: one such entry must not break the gateway's whole ``tools/list``), one larger than the
bounds below, and every tool past ``MAX_TOOLS``: a tunnel's list is the connector's to write.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from pydantic import ValidationError

from sandhold.errors import InvalidRequest, NotFound, PayloadTooLarge, ProviderError, Unavailable
from sandhold.gateway.tool_args import MODELS
from sandhold.tunnel.registry import Registry, TunnelInfo
from sandhold.tunnel.relay import Relay

log = logging.getLogger(__name__)

PROTOCOL_VERSION = "2025-11-25"  # the handshake era's newest
MODERN = "2026-07-28"  # the stateless era's
CLIENT_INFO = {"name": "sandhold-gateway", "version": "0.1.0"}
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_PAGES = 20
SEP = "__"
MAX_TOOLS = 256  # offered per tunnel; the rest are refused
MAX_DESCRIPTION = 16384  # characters of a tool's description
MAX_SCHEMA_BYTES = 65536  # of a tool's input schema, as JSON
MAX_REFUSED = 50  # reasons kept (and logged) per listing


def exposed_name(tunnel: str, channel: str, tool: str) -> str:
    return f"{tunnel}{SEP}{tool}" if channel == "main" else f"{tunnel}{SEP}{channel}{SEP}{tool}"


def is_tunnel_tool(name: str) -> bool:
    return SEP in name and name not in MODELS


@dataclass
class Listing:
    expires: float
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # exposed name -> entry
    refused: list[str] = field(default_factory=list)


class TunnelClient:
    def __init__(self, relay: Relay, registry: Registry) -> None:
        self.relay = relay
        self.registry = registry
        self.settings = relay.settings
        self._sessions: dict[tuple[str, str], dict[str, str]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._listings: dict[str, Listing] = {}
        self._fetches: dict[str, asyncio.Task[Listing]] = {}  # tunnel id -> listing under way

    # -- JSON-RPC through the tunnel -----------------------------------------------------------
    async def _send(
        self,
        tunnel: TunnelInfo,
        channel: str,
        method: str,
        params: dict[str, Any] | None,
        timeout_s: float,
        notify: bool = False,
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        headers: dict[str, list[str]] = {}
        session = self._sessions.get((tunnel.id, channel), {})
        if session.get("modern") or method == "server/discover":
            params, headers = _modern(method, params)
        if params is not None:
            message["params"] = params
        if not notify:
            message["id"] = f"sh-{uuid.uuid4().hex[:16]}"
        if session.get("session_id"):
            headers["Mcp-Session-Id"] = [session["session_id"]]
        if session.get("protocol"):
            headers["Mcp-Protocol-Version"] = [session["protocol"]]
        return await self.relay.request(tunnel.id, channel, message, headers, timeout_s)

    async def _session(self, tunnel: TunnelInfo, channel: str, timeout_s: float) -> None:
        key = (tunnel.id, channel)
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key in self._sessions:
                return
            self._sessions.pop(key, None)
            # The stateless era first (what ChatGPT's connector probes with too); a server that
            # does not know server/discover answers it with an error: the handshake then.
            found = await self._send(tunnel, channel, "server/discover", {}, timeout_s)
            result = (found.get("resp_json") or {}).get("result")
            if isinstance(result, dict) and MODERN in (result.get("supportedVersions") or []):
                self._sessions[key] = {"modern": MODERN, "protocol": MODERN}
                return
            params = {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": CLIENT_INFO,
            }
            resp = await self._send(tunnel, channel, "initialize", params, timeout_s)
            result = _result(tunnel, channel, "initialize", resp)
            headers = {k.lower(): v for k, v in (resp.get("resp_headers") or {}).items()}
            sid = (headers.get("mcp-session-id") or [""])[0]
            self._sessions[key] = {
                "session_id": sid,
                "protocol": str(result.get("protocolVersion") or ""),
            }
            await self._send(
                tunnel, channel, "notifications/initialized", None, timeout_s, notify=True
            )

    async def rpc(
        self,
        tunnel: TunnelInfo,
        channel: str,
        method: str,
        params: dict[str, Any],
        timeout_s: float,
    ) -> dict[str, Any]:
        """``method``'s result, after the handshake; once more with a new session when the
        server forgot ours (HTTP 404, as MCP's streamable HTTP transport says)."""
        for attempt in (1, 2):
            await self._session(tunnel, channel, timeout_s)
            resp = await self._send(tunnel, channel, method, params, timeout_s)
            if resp.get("resp_code") == 404 and attempt == 1:
                self._sessions.pop((tunnel.id, channel), None)
                continue
            return _result(tunnel, channel, method, resp)
        raise AssertionError("unreachable")

    # -- tools ---------------------------------------------------------------------------------
    def last_listing(self, tunnel_id: str) -> Listing | None:
        """What this replica last listed of the tunnel's tools (fresh or not), if anything."""
        return self._listings.get(tunnel_id)

    async def listing(
        self, tunnel: TunnelInfo, force: bool = False, wait_s: float | None = None
    ) -> Listing:
        """The tunnel's tools: the listing cached while it is fresh, else a new one (one fetch
        at a time per tunnel). Meanwhile a stale listing is served at once, unless ``force``;
        with none to serve, the caller waits ``wait_s`` at most (None: for the fetch) and then
        gets an empty listing while the fetch goes on: a stalled connector must not hold up
        the tenant's whole ``tools/list``."""
        cached = self._listings.get(tunnel.id)
        if cached is not None and not force and cached.expires > time.monotonic():
            return cached
        s = self.settings
        channels = await asyncio.to_thread(
            self.registry.live_channels, tunnel.id, s.gateway_tunnel_stale_s
        )
        if not channels:  # down: it offers nothing, at once (what it offered is not served)
            self._listings[tunnel.id] = Listing(time.monotonic() + s.gateway_tunnel_tools_ttl_s)
            return self._listings[tunnel.id]
        task = self._fetches.get(tunnel.id)
        if task is None:
            task = asyncio.create_task(self._fetch(tunnel, channels, cached))
            self._fetches[tunnel.id] = task
            task.add_done_callback(lambda t: self._fetched(tunnel, t))
        if cached is not None and not force:
            return cached
        try:
            return await asyncio.wait_for(asyncio.shield(task), wait_s)
        except TimeoutError:
            return Listing(expires=0)

    def _fetched(self, tunnel: TunnelInfo, task: asyncio.Task[Listing]) -> None:
        self._fetches.pop(tunnel.id, None)
        if not task.cancelled() and (e := task.exception()) is not None:
            log.warning("tunnel %s: listing its tools failed: %s", tunnel.name, e)

    async def _fetch(
        self, tunnel: TunnelInfo, channels: list[str], cached: Listing | None
    ) -> Listing:
        s = self.settings
        timeout = min(s.gateway_tunnel_call_timeout_s, 15.0)

        async def tools_of(channel: str) -> list[tuple[str, dict[str, Any]]]:
            try:
                return [(channel, t) for t in await self._list(tunnel, channel, timeout)]
            except Exception as e:  # a channel that does not answer offers what it did
                why = getattr(e, "message", e)
                log.warning(
                    "tunnel %s channel %s: tools/list failed: %s", tunnel.name, channel, why
                )
                old = cached.tools.values() if cached is not None else ()
                return [(v["channel"], v["tool"]) for v in old if v["channel"] == channel]

        found = [f for part in await asyncio.gather(*map(tools_of, channels)) for f in part]
        listing = _name(tunnel, found)
        listing.expires = time.monotonic() + s.gateway_tunnel_tools_ttl_s
        for why in listing.refused:
            log.warning("tunnel %s: %s", tunnel.name, why)
        self._listings[tunnel.id] = listing
        return listing

    async def _list(self, tunnel: TunnelInfo, channel: str, timeout: float) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        params: dict[str, Any] = {}
        for _page in range(MAX_PAGES):
            result = await self.rpc(tunnel, channel, "tools/list", params, timeout)
            page = result.get("tools")
            tools += [t for t in page if isinstance(t, dict)] if isinstance(page, list) else []
            cursor = result.get("nextCursor")
            if not cursor or len(tools) > 4 * MAX_TOOLS:
                break
            params = {"cursor": cursor}
        return tools

    async def tools_of(self, tunnels: list[TunnelInfo]) -> dict[str, dict[str, Any]]:
        """Every tool the tenant's tunnels offer now, by exposed name (a tunnel never listed
        yet is waited for ``gateway_tunnel_list_wait_s`` at most)."""
        wait_s = self.settings.gateway_tunnel_list_wait_s
        listings = await asyncio.gather(*(self.listing(t, wait_s=wait_s) for t in tunnels))
        return {name: entry for lst in listings for name, entry in lst.tools.items()}

    async def call(
        self, tunnel: TunnelInfo, name: str, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ``tools/call`` result of the exposed tool ``name``, and its listing entry."""
        s = self.settings
        channels = await asyncio.to_thread(
            self.registry.live_channels, tunnel.id, s.gateway_tunnel_stale_s
        )
        if not channels:
            raise Unavailable(
                f"tunnel {tunnel.name!r} is down: no connector has polled it in the last "
                f"{s.gateway_tunnel_stale_s:g} s (start `sandhold tunnel connect` in the private "
                "network, or check it with `sandhold tunnel doctor`)"
            )
        entry = (await self.listing(tunnel)).tools.get(name)
        if entry is None:
            entry = (await self.listing(tunnel, force=True)).tools.get(name)
        if entry is None:
            raise NotFound(
                f"tunnel {tunnel.name!r} offers no tool {name!r} (tools are "
                "<tunnel>__<tool>; see tools/list)"
            )
        params = {"name": entry["tool"]["name"], "arguments": arguments}
        result = await self.rpc(
            tunnel, entry["channel"], "tools/call", params, s.gateway_tunnel_call_timeout_s
        )
        try:
            types.CallToolResult.model_validate(result)
        except ValidationError as e:
            raise ProviderError(
                f"tunnel {tunnel.name!r} (channel {entry['channel']}), tools/call: the internal "
                f"MCP server's result is not a CallToolResult ({_first_problem(e)})"
            ) from None
        return result, entry


def _modern(
    method: str, params: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """A 2026-07-28 request's params (with their ``_meta`` envelope) and headers."""
    meta = {
        types.PROTOCOL_VERSION_META_KEY: MODERN,
        types.CLIENT_CAPABILITIES_META_KEY: {},
        types.CLIENT_INFO_META_KEY: CLIENT_INFO,
    }
    params = {**(params or {}), "_meta": {**(params or {}).get("_meta", {}), **meta}}
    headers = {"Mcp-Protocol-Version": [MODERN], "Mcp-Method": [method]}
    if method == "tools/call" and isinstance(params.get("name"), str):
        headers["Mcp-Name"] = [params["name"]]
    return params, headers


def _name(tunnel: TunnelInfo, found: list[tuple[str, dict[str, Any]]]) -> Listing:
    listing = Listing(expires=0)
    refused: list[str] = []
    owners: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for channel, tool in found:
        raw = tool.get("name")
        if not isinstance(raw, str):
            refused.append(f"channel {channel}: a tool without a name")
            continue
        owners.setdefault(exposed_name(tunnel.name, channel, raw), []).append((channel, tool))
    for name, owned in sorted(owners.items()):
        if name in MODELS:
            refused.append(f"tool {name!r} would shadow the built-in tool: refused")
        elif not TOOL_NAME_RE.match(name):
            refused.append(f"tool {name[:80]!r} is not [A-Za-z0-9_-]{{1,64}}: refused")
        elif len(owned) > 1:
            refused.append(
                f"tool {name!r} is offered twice (channels "
                f"{', '.join(c for c, _ in owned)}): refused"
            )
        elif isinstance(clean := _clean(owned[0][1]), str):
            refused.append(f"tool {name!r} {clean}: refused")
        elif len(listing.tools) >= MAX_TOOLS:
            refused.append(f"tool {name!r}: the tunnel offers more than {MAX_TOOLS} tools: refused")
        else:
            listing.tools[name] = {"channel": owned[0][0], "tool": clean}
    listing.refused = refused[:MAX_REFUSED]
    if len(refused) > MAX_REFUSED:
        listing.refused.append(f"and {len(refused) - MAX_REFUSED} more tools refused")
    return listing


def _clean(tool: dict[str, Any]) -> dict[str, Any] | str:
    """What the gateway offers of a connector's tool (name, description, schema, annotations),
    checked as an MCP ``Tool``; or why it is refused."""
    offered = {
        "name": tool["name"],
        "description": tool.get("description"),
        "inputSchema": tool.get("inputSchema") or {"type": "object"},
        "annotations": tool.get("annotations"),
    }
    try:
        types.Tool.model_validate(offered)
    except ValidationError as e:
        return f"is not a valid MCP tool ({_first_problem(e)})"
    if len(offered["description"] or "") > MAX_DESCRIPTION:
        return f"has a description of more than {MAX_DESCRIPTION} characters"
    if offered["inputSchema"].get("type") != "object":
        return 'has an input schema whose type is not "object"'
    if len(json.dumps(offered["inputSchema"])) > MAX_SCHEMA_BYTES:
        return f"has an input schema of more than {MAX_SCHEMA_BYTES} bytes"
    return offered


def _first_problem(e: ValidationError) -> str:
    err = e.errors(include_url=False)[0]
    return f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}"[:200]


def _result(tunnel: TunnelInfo, channel: str, method: str, resp: dict[str, Any]) -> dict[str, Any]:
    """The JSON-RPC result in a connector's response, or the error it carries, as ours."""
    where = f"tunnel {tunnel.name!r} (channel {channel}), {method}"
    body = resp.get("resp_json")
    if not isinstance(body, dict):
        raise ProviderError(
            f"{where}: the connector answered HTTP {resp.get('resp_code')} "
            "without a JSON-RPC response"
        )
    if isinstance(body.get("result"), dict):
        return dict(body["result"])
    err = body.get("error")
    if not isinstance(err, dict):
        raise ProviderError(f"{where}: not a JSON-RPC response")
    code, message = err.get("code"), str(err.get("message", ""))[:500]
    failure = (
        (err.get("data") or {}).get("tunnel_failure") if isinstance(err.get("data"), dict) else None
    )
    if isinstance(failure, dict):
        kind = failure.get("transport_error_kind") or failure.get("source")
        if kind == "response_body_too_large":
            raise PayloadTooLarge(f"{where}: {message}")
        raise Unavailable(
            f"{where}: the connector could not reach the internal MCP server ({kind}): {message}"
        )
    if code in (-32600, -32601, -32602):
        raise InvalidRequest(f"{where}: the internal MCP server refused it ({code}): {message}")
    raise ProviderError(f"{where}: the internal MCP server failed ({code}): {message}")
