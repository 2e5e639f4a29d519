"""The gateway's tunnel endpoints: the connector-facing ones, in the wire shape of OpenAI's
tunnel-client protocol (docs/tunnel.md has what matches), and the admin API.

Connector-facing (``Authorization: Bearer <tunnel token>``; a token opens its own tunnel only):

- ``GET  /v1/tunnels/{id}``: ``{id, name, description}``
- ``GET  /v1/tunnels/{id}/poll?limit=&timeout_ms=&channel=``: 200 ``{"commands": [...]}`` or 204
- ``POST /v1/tunnels/{id}/response`` (header ``X-Tunnel-Shard-Token``): ``{"status": "ok"}``
- the singular ``/v1/tunnel/{id}/...`` forms of the last two, as compatibility aliases.

Their errors carry both shapes: ``{code, message}`` as everywhere on the gateway, and
``{"error": {message, type, code}}`` as tunnel-client reads them.

Admin (``gateway_admin_key``): ``POST|GET /v1/admin/tenants/{tenant}/tunnels``,
``GET|DELETE /v1/admin/tunnels/{id}``, ``POST /v1/admin/tunnels/{id}/reveal_token`` and
``.../rotate_token``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold import http_edge
from sandhold.errors import (
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    SandholdError,
    Unauthenticated,
)
from sandhold.gateway.errors import rest_status
from sandhold.gateway.policy import ID_RE, check_id
from sandhold.tunnel.registry import TunnelInfo, check_name, check_tunnel_id

if TYPE_CHECKING:
    from sandhold.gateway.app import Gateway

CHANNEL_RE = re.compile(r"^[a-z0-9_-]{1,64}$")
RESP_TYPES = {"jsonrpc_response", "jsonrpc_notify", "notify_ack", "session_termination_response"}
RESP_FIELDS = {"request_id", "channel", "resp_json", "resp_headers", "resp_code", "resp_type"}
MAX_SERVER_INFO = 4096
# what tunnel-client's error codes say for ours
OPENAI_CODES = {
    "unauthorized": "tunnel_use_forbidden",
    "not_found": "pending_request_not_found",
    "payload_too_large": "request_body_too_large",
    "invalid_argument": "invalid_json_payload",
}


def tunnel_error(e: SandholdError, openai_code: str | None = None) -> JSONResponse:
    status = rest_status(e)
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse(
        {
            "code": e.code,
            "message": e.message,
            "error": {
                "message": e.message,
                "type": kind,
                "code": openai_code or OPENAI_CODES.get(e.code),
            },
        },
        status_code=status,
    )


def _channels(request: Request) -> list[str]:
    """The channels the connector serves, from ``X-Tunnel-MCP-Server-Info`` (main if none)."""
    raw = request.headers.get("x-tunnel-mcp-server-info")
    if not raw:
        return ["main"]
    try:
        if len(raw.encode()) > MAX_SERVER_INFO:
            raise ValueError
        info = json.loads(raw)
        names = [c["name"] for c in info["channels"]]
        if (
            not names
            or len(names) > 32
            or not all(isinstance(n, str) and CHANNEL_RE.match(n) for n in names)
        ):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise InvalidRequest(
            "X-Tunnel-MCP-Server-Info is not a valid channel declaration "
            '({"version": 1, "channels": [{"name": "main"}]})'
        ) from None
    return sorted(set(names))


def _short(value: str | None) -> str | None:
    return None if value is None else value[:64]


class TunnelRoutes:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.tunnels = gw.tunnels
        self.settings = gw.settings

    async def _tunnel(self, request: Request) -> TunnelInfo:
        tunnel_id = request.path_params["tunnel_id"]
        token = http_edge.bearer(request.headers)
        tunnel = await asyncio.to_thread(self.tunnels.registry.by_token, token) if token else None
        if tunnel is None:
            raise Unauthenticated(
                "missing or unknown tunnel token (Authorization: Bearer "
                "<tunnel token>; a tenant's API key is not one)"
            )
        if tunnel.id != tunnel_id:
            raise NotFound(f"tunnel {tunnel_id[:80]!r} does not exist, or this is not its token")
        return tunnel

    # -- connector-facing ----------------------------------------------------------------------
    async def metadata(self, request: Request) -> Response:
        try:
            t = await self._tunnel(request)
        except SandholdError as e:
            return tunnel_error(e)
        return JSONResponse({"id": t.id, "name": t.name, "description": t.description})

    async def poll(self, request: Request) -> Response:
        try:
            t = await self._tunnel(request)
            serves = _channels(request)
            wanted = request.query_params.getlist("channel")
            if any(not CHANNEL_RE.match(c) for c in wanted):
                raise InvalidRequest("a channel is lower-case letters, digits, '-' or '_'")
            limit = _int(request.query_params.get("limit"), "limit", 10, 1, 25)
            wait_ms = _int(request.query_params.get("timeout_ms"), "timeout_ms", 15000, 0, None)
        except SandholdError as e:
            return tunnel_error(e)
        wait_s = min(wait_ms / 1000, self.settings.gateway_tunnel_poll_max_s)
        instance = _short(request.headers.get("x-tunnel-client-instance-id")) or "unnamed"
        name = _short(request.headers.get("x-tunnel-client-name"))
        version = _short(request.headers.get("x-tunnel-client-version"))
        replica = self.gw.manager.replica

        async def seen() -> None:
            await asyncio.to_thread(
                self.tunnels.registry.seen, t.id, instance, name, version, serves, replica
            )

        channels = sorted(set(wanted) & set(serves)) if wanted else serves
        try:
            commands = await self.tunnels.relay.poll(
                t.id, instance, channels, limit, wait_s, seen, request.is_disconnected
            )
        except QuotaExceeded as e:
            return tunnel_error(e)
        if not commands:
            return Response(status_code=204)
        return JSONResponse({"commands": commands})

    async def response(self, request: Request) -> Response:
        shard = request.headers.get("x-tunnel-shard-token")
        try:
            t = await self._tunnel(request)
            if not shard:
                raise InvalidRequest(
                    "X-Tunnel-Shard-Token is required (the polled command's shard_token)"
                )
            body = await self._body(request, t, shard)
            await self.tunnels.relay.respond(t.id, shard, body)
        except SandholdError as e:
            return tunnel_error(e)
        return JSONResponse({"status": "ok"})

    async def _body(self, request: Request, t: TunnelInfo, shard: str) -> dict[str, Any]:
        limit = self.settings.gateway_tunnel_max_response_bytes
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                await self.tunnels.relay.refuse_oversized(t.id, shard)
                raise PayloadTooLarge(
                    f"the response body is more than {limit} bytes "
                    "(gateway_tunnel_max_response_bytes)"
                )
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except ValueError as e:
            raise InvalidRequest(f"the response body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise InvalidRequest("the response body must be a JSON object")
        unknown = sorted(set(body) - RESP_FIELDS)
        if unknown:
            raise InvalidRequest(f"unknown field {unknown[0]!r} in the response body")
        if not isinstance(body.get("request_id"), str) or not isinstance(
            body.get("resp_code"), int
        ):
            raise InvalidRequest("request_id (string) and resp_code (integer) are required")
        if body.get("resp_type", "jsonrpc_response") not in RESP_TYPES:
            raise InvalidRequest(f"resp_type must be one of {', '.join(sorted(RESP_TYPES))}")
        if "resp_json" in body and not isinstance(body["resp_json"], dict):
            raise InvalidRequest("resp_json must be a JSON-RPC object")
        return body

    # -- admin ---------------------------------------------------------------------------------
    def _admin(self, request: Request) -> None:
        expected = self.settings.gateway_admin_key
        key = http_edge.bearer(request.headers)
        if not expected or not key or not hmac.compare_digest(key, expected):
            raise Unauthenticated("the admin API needs the admin key (Authorization: Bearer ...)")

    async def create(self, request: Request) -> Response:
        self._admin(request)
        tenant_id = check_id(request.path_params["tenant_id"], "tenant id", ID_RE)
        body = await http_edge.read_json_object(request, 65536, "a tunnel's record: 64 KiB")
        if set(body) - {"name", "description"}:
            raise InvalidRequest('the body is {"name": ..., "description": ...}')
        info, token = await asyncio.to_thread(
            self.tunnels.registry.create,
            tenant_id,
            check_name(body.get("name")),
            "" if body.get("description") is None else body["description"],  # a str: checked
        )
        return JSONResponse({**info.public(), "token": token}, status_code=201)

    async def list(self, request: Request) -> Response:
        self._admin(request)
        tenant_id = check_id(request.path_params["tenant_id"], "tenant id", ID_RE)
        rows = await asyncio.to_thread(self.tunnels.registry.list, tenant_id)
        stale = self.settings.gateway_tunnel_stale_s
        return JSONResponse({"tunnels": [r.public(stale) for r in rows]})

    async def get(self, request: Request) -> Response:
        self._admin(request)
        info = await asyncio.to_thread(self.tunnels.registry.get, request.path_params["tunnel_id"])
        out = info.public(self.settings.gateway_tunnel_stale_s)
        listing = self.tunnels.client.last_listing(info.id)
        out["tools"] = sorted(listing.tools) if listing else None
        out["refused_tools"] = listing.refused if listing else None
        return JSONResponse(out)

    async def delete(self, request: Request) -> Response:
        self._admin(request)
        tunnel_id = check_tunnel_id(request.path_params["tunnel_id"])
        await asyncio.to_thread(self.tunnels.registry.delete, tunnel_id)
        return JSONResponse({"id": tunnel_id, "deleted": True})

    async def reveal(self, request: Request) -> Response:
        self._admin(request)
        token = await asyncio.to_thread(
            self.tunnels.registry.reveal, request.path_params["tunnel_id"]
        )
        return JSONResponse({"token": token}, headers={"Cache-Control": "no-store"})

    async def rotate(self, request: Request) -> Response:
        self._admin(request)
        token = await asyncio.to_thread(
            self.tunnels.registry.rotate, request.path_params["tunnel_id"]
        )
        return JSONResponse({"token": token}, headers={"Cache-Control": "no-store"})


def _int(raw: str | None, name: str, default: int, low: int, high: int | None) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be an integer") from None
    if value < low or (high is not None and value > high):
        raise InvalidRequest(f"{name} must be from {low}" + (f" to {high}" if high else " up"))
    return value


def routes(gw: Gateway) -> list[Route]:
    r = TunnelRoutes(gw)
    out = [
        Route("/v1/tunnels/{tunnel_id}", r.metadata, methods=["GET"]),
        Route("/v1/admin/tenants/{tenant_id}/tunnels", r.create, methods=["POST"]),
        Route("/v1/admin/tenants/{tenant_id}/tunnels", r.list, methods=["GET"]),
        Route("/v1/admin/tunnels/{tunnel_id}", r.get, methods=["GET"]),
        Route("/v1/admin/tunnels/{tunnel_id}", r.delete, methods=["DELETE"]),
        Route("/v1/admin/tunnels/{tunnel_id}/reveal_token", r.reveal, methods=["POST"]),
        Route("/v1/admin/tunnels/{tunnel_id}/rotate_token", r.rotate, methods=["POST"]),
    ]
    for prefix in ("/v1/tunnels", "/v1/tunnel"):  # the singular: tunnel-client's alias
        out += [
            Route(f"{prefix}/{{tunnel_id}}/poll", r.poll, methods=["GET"]),
            Route(f"{prefix}/{{tunnel_id}}/response", r.response, methods=["POST"]),
        ]
    return out
