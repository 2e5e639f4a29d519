"""The REST API (and the MCP streamable-HTTP endpoint on the same port), with an OpenAPI schema.

Every error is ``{"code": <stable string>, "message": <text>}`` with the matching HTTP status.
Tenants authenticate with ``Authorization: Bearer <tenant key>``; the admin API (tenants, a
reclaim pass on demand) with the configured admin key.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator
from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold import http_edge
from sandhold.console import gateway as console
from sandhold.errors import (
    InvalidRequest,
    NotFound,
    SandholdError,
    Unauthenticated,
)
from sandhold.gateway import scenario
from sandhold.gateway.app import Gateway
from sandhold.gateway.errors import rest_status
from sandhold.gateway.mcp_server import SESSION_HEADER, build_mcp
from sandhold.gateway.policy import ID_RE, TenantPolicy, check_id
from sandhold.gateway.prom import CONTENT_TYPE
from sandhold.gateway.timeline import event_json
from sandhold.gateway.tool_args import DESCRIPTIONS, MODELS, tool_schemas
from sandhold.gateway.views import view_mounts
from sandhold.tunnel.routes import routes as tunnel_routes

MAX_JSON_OVERHEAD = 64 * 1024


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


class Api:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.max_body = gw.settings.gateway_max_payload_bytes * 4 // 3 + MAX_JSON_OVERHEAD

    async def tenant(self, request: Request) -> str:
        return await self.gw.tenant_of_key(http_edge.bearer(request.headers))

    def admin(self, request: Request) -> None:
        expected = self.gw.settings.gateway_admin_key
        key = http_edge.bearer(request.headers)
        if not expected or not key or not hmac.compare_digest(key, expected):
            raise Unauthenticated("the admin API needs the admin key (Authorization: Bearer ...)")

    async def json_body(self, request: Request) -> dict[str, Any]:
        return await http_edge.read_json_object(
            request, self.max_body, "gateway_max_payload_bytes, base64 and JSON included"
        )

    # -- tenant API ---------------------------------------------------------------------------
    async def call_tool(self, request: Request) -> Response:
        tenant, policy = await self.gw.tenant_and_policy(http_edge.bearer(request.headers))
        scenario.from_headers(request.headers)
        tool = request.path_params["tool"]
        tunnel_tool = self.gw.tunnels.is_tunnel_tool(tool)  # <tunnel>__<tool> (docs/tunnel.md)
        if tool not in MODELS and not tunnel_tool:
            raise NotFound(f"unknown tool {tool!r}; tools: {', '.join(MODELS)}")
        body = await self.json_body(request)
        if "session_id" in body:
            raise InvalidRequest("the session is the path's; do not pass session_id in the body")
        session_id = request.path_params["session_id"]
        if tunnel_tool:
            return JSONResponse(await self.gw.tunnels.call(tenant, session_id, tool, body))
        result = await self.gw.tools.call(tenant, tool, body, session_id, policy)
        return JSONResponse(result)

    async def status(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        return JSONResponse(await self.gw.manager.status(tenant, request.path_params["session_id"]))

    async def prepare(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        session_id = request.path_params["session_id"]
        wait = request.query_params.get("wait", "true")
        if wait not in ("true", "false"):
            raise InvalidRequest("wait must be true or false")
        if wait == "false":
            await self.gw.manager.policy(tenant)  # an unknown tenant fails now, not later
            self.gw.manager.prepare_in_background(tenant, session_id)
            return JSONResponse({"session_id": session_id, "preparing": True}, status_code=202)
        scenario.from_headers(request.headers)
        prepared = await self.gw.manager.prepare(tenant, session_id)
        await scenario.label(self.gw.manager, tenant, session_id)
        return JSONResponse(prepared)

    async def close(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        return JSONResponse(await self.gw.manager.close(tenant, request.path_params["session_id"]))

    async def timeline(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        row = await self.gw.manager.session(tenant, request.path_params["session_id"])
        events = await self.gw.manager.db(self.gw.store.timeline, tenant, row.session_id)
        events.sort(key=lambda e: (e.at, e.id))
        return JSONResponse(
            {
                "session_id": row.session_id,
                "tenant_id": tenant,
                "events": [event_json(e) for e in events],
            }
        )

    async def sessions(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        rows = await self.gw.manager.db(self.gw.store.sessions, tenant)
        return JSONResponse(
            [
                {
                    "session_id": r.session_id,
                    "state": r.state,
                    "sandbox_id": r.sandbox_id,
                    "created_at": r.created_at,
                }
                for r in rows
            ]
        )

    async def stats(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        return JSONResponse(await self.gw.manager.db(self.gw.store.aggregates, tenant))

    async def deliverable(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        d = await self.gw.manager.db(
            self.gw.store.get_deliverable, tenant, request.path_params["id"]
        )
        if d is None:
            raise NotFound(f"deliverable {request.path_params['id']!r} does not exist")
        data = await self.gw.deliverables.get(d.key)
        return Response(
            data,
            media_type="application/octet-stream",
            headers={
                "Content-Disposition": f'attachment; filename="{d.name}"',
                "X-Sandhold-Sha256": d.sha256,
            },
        )

    async def tools(self, request: Request) -> Response:
        if http_edge.bearer(request.headers) is None:
            return JSONResponse(tool_schemas())
        tenant = await self.tenant(request)  # with a tenant's key: its tunnel tools too
        return JSONResponse([*tool_schemas(), *await self.gw.tunnels.schemas(tenant)])

    async def health(self, request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "replica": self.gw.manager.replica, "provider": self.gw.provider.name}
        )

    async def metrics(self, request: Request) -> Response:
        """Prometheus text (gateway/prom.py): the admin key or gateway_metrics_token."""
        self.gw.metrics.authorize(http_edge.bearer(request.headers))
        return Response(await self.gw.metrics.exposition(), media_type=CONTENT_TYPE)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_schema())

    # -- admin API ----------------------------------------------------------------------------
    async def put_tenant(self, request: Request) -> Response:
        self.admin(request)
        tenant_id = check_id(request.path_params["tenant_id"], "tenant id", ID_RE)
        body = await self.json_body(request)
        unknown = set(body) - {"policy", "api_key"}
        if unknown:
            raise InvalidRequest(f"unknown field {sorted(unknown)[0]!r}; use policy and api_key")
        try:
            policy = TenantPolicy.model_validate(body.get("policy") or {})
        except ValidationError as e:
            problems = [
                f"{'.'.join(map(str, err['loc'])) or 'policy'}: "
                f"{err['msg'].removeprefix('Value error, ')}"
                for err in e.errors(include_url=False)
            ]
            raise InvalidRequest("invalid policy: " + "; ".join(problems)) from None
        key = body.get("api_key")
        if key is not None and (not isinstance(key, str) or len(key) < 16):
            raise InvalidRequest("api_key must be a string of at least 16 characters")
        await self.gw.manager.db(view_mounts, policy.skills, policy.references, self.gw.settings)
        await self.gw.put_tenant(tenant_id, policy, key)
        return JSONResponse({"tenant_id": tenant_id, "policy": policy.model_dump()})

    async def get_tenant(self, request: Request) -> Response:
        self.admin(request)
        tenant_id = request.path_params["tenant_id"]
        policy = await self.gw.manager.policy(tenant_id)
        return JSONResponse({"tenant_id": tenant_id, "policy": policy.model_dump()})

    async def reclaim(self, request: Request) -> Response:
        self.admin(request)
        report = await self.gw.reclaimer.run_pass()
        return JSONResponse(report.public())

    async def tenant_stats(self, request: Request) -> Response:
        self.admin(request)
        tenant_id = request.path_params["tenant_id"]
        return JSONResponse(await self.gw.manager.db(self.gw.store.aggregates, tenant_id))


def routes(api: Api) -> list[Route]:
    return [
        Route("/health", api.health, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
        Route("/v1/tools", api.tools, methods=["GET"]),
        Route("/v1/sessions", api.sessions, methods=["GET"]),
        Route("/v1/sessions/{session_id}", api.status, methods=["GET"]),
        Route("/v1/sessions/{session_id}", api.close, methods=["DELETE"]),
        Route("/v1/sessions/{session_id}/timeline", api.timeline, methods=["GET"]),
        Route("/v1/sessions/{session_id}/prepare", api.prepare, methods=["POST"]),
        Route("/v1/sessions/{session_id}/tools/{tool}", api.call_tool, methods=["POST"]),
        Route("/v1/stats", api.stats, methods=["GET"]),
        Route("/v1/deliverables/{id}", api.deliverable, methods=["GET"]),
        Route("/v1/admin/tenants/{tenant_id}", api.put_tenant, methods=["PUT"]),
        Route("/v1/admin/tenants/{tenant_id}", api.get_tenant, methods=["GET"]),
        Route("/v1/admin/tenants/{tenant_id}/stats", api.tenant_stats, methods=["GET"]),
        Route("/v1/admin/reclaim", api.reclaim, methods=["POST"]),
    ]


def build_app(gw: Gateway) -> Starlette:
    api = Api(gw)

    async def identity(ctx: Context[Any, Any]) -> tuple[str, str | None]:
        headers = ctx.headers or {}
        tenant = await gw.tenant_of_key(http_edge.bearer(headers))
        scenario.from_headers(headers)
        return tenant, headers.get(SESSION_HEADER)

    mcp = build_mcp(gw.tools, identity, gw.tunnels)
    # Stateless: any replica behind a load balancer can answer any MCP request.
    mcp_app = mcp.streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with gw.running(), mcp.session_manager.run():
            yield

    return Starlette(
        routes=[*routes(api), *tunnel_routes(gw), *console.routes(gw), *mcp_app.routes],
        lifespan=lifespan,
        exception_handlers={
            SandholdError: _sandhold_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
    )


async def _sandhold_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SandholdError)
    return error(rest_status(exc), exc.code, exc.message)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error(404, "not_found", f"no such endpoint: {request.method} {request.url.path}")
    if exc.status_code == 405:
        return error(405, "method_not_allowed", f"{request.method} is not allowed here")
    return error(exc.status_code, "http_error", str(exc.detail))


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error(500, "internal", f"internal error: {type(exc).__name__}")


def openapi_schema() -> dict[str, Any]:
    err = {"$ref": "#/components/schemas/Error"}
    responses = {
        s: {"description": d, "content": {"application/json": {"schema": err}}}
        for s, d in (
            ("400", "invalid arguments"),
            ("401", "bad API key"),
            ("403", "outside the session's file view"),
            ("404", "not found"),
            ("409", "session closed"),
            ("413", "payload too large"),
            ("429", "quota exceeded"),
            ("502", "provider failure"),
            ("503", "session busy"),
        )
    }
    session = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {
        "Error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        },
    }
    for name, model in MODELS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schema["properties"].pop("session_id", None)
        schemas[model.__name__] = schema
        paths[f"/v1/sessions/{{session_id}}/tools/{name}"] = {
            "post": {
                "operationId": name,
                "summary": DESCRIPTIONS[name],
                "parameters": [session],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "the tool's result",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    **responses,
                },
            }
        }
    for path, method, summary in (
        ("/v1/sessions/{session_id}", "get", "session status (never resumes the sandbox)"),
        ("/v1/sessions/{session_id}", "delete", "close the session"),
        ("/v1/sessions/{session_id}/timeline", "get", "the session's timeline"),
        (
            "/v1/sessions/{session_id}/prepare",
            "post",
            "create or resume the session's sandbox "
            "now, before its first tool call (?wait=false: 202, in the background)",
        ),
    ):
        paths.setdefault(path, {})[method] = {
            "summary": summary,
            "parameters": [session],
            "responses": {"200": {"description": "ok"}, **responses},
        }
    for path, summary in (
        ("/v1/sessions", "the tenant's sessions"),
        ("/v1/stats", "the tenant's aggregates"),
        ("/v1/tools", "the tools and their argument schemas"),
    ):
        paths[path] = {"get": {"summary": summary, "responses": {"200": {"description": "ok"}}}}
    paths["/v1/deliverables/{id}"] = {
        "get": {
            "summary": "a deliverable's bytes",
            "parameters": [
                {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "responses": {
                "200": {"description": "the file", "content": {"application/octet-stream": {}}},
                **responses,
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Sandhold gateway", "version": "1"},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
