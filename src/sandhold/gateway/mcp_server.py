"""The tools over MCP, with the official ``mcp`` SDK: stdio and streamable HTTP.

Over HTTP the tenant comes from the bearer key and the session from the ``X-Sandhold-Session``
header (or an explicit ``session_id`` argument); over stdio both are fixed when the operator
starts the process (``sandhold gateway mcp --tenant T --session S``). Tool errors come back as
MCP tool errors carrying ``{code, message}``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from sandhold.errors import SandholdError
from sandhold.gateway.errors import mcp_retryable
from sandhold.gateway.tool_args import DESCRIPTIONS, MODELS
from sandhold.gateway.tools import Tools

SESSION_HEADER = "x-sandhold-session"

# (tenant, session) of a request, from the connection
Identity = Callable[[Context[Any, Any]], Awaitable[tuple[str, str | None]]]


def _tool(tools: Tools, name: str, identity: Identity) -> Callable[..., Any]:
    """A function whose signature is the tool's argument model, as MCPServer introspects."""
    model = MODELS[name]

    async def call(ctx: Context[Any, Any], **_parsed: Any) -> dict[str, Any]:
        # The raw arguments, not the SDK's parse (which drops unknown keys): an argument that
        # tries to set policy must be refused, not silently ignored.
        raw = dict((ctx.request_context.params or {}).get("arguments") or {})
        try:
            tenant_id, session_id = await identity(ctx)
            return await tools.call(tenant_id, name, raw, session_id)
        except SandholdError as e:
            raise ToolError(
                json.dumps({"code": e.code, "message": e.message, "retryable": mcp_retryable(e)})
            ) from None

    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    annotations: dict[str, Any] = {"ctx": Context, "return": dict[str, Any]}
    for field_name, f in model.model_fields.items():
        ann = Annotated[f.annotation, Field(description=f.description)]  # type: ignore[name-defined]
        default = (
            inspect.Parameter.empty if f.is_required() else f.get_default(call_default_factory=True)
        )
        params.append(
            inspect.Parameter(
                field_name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=default
            )
        )
        annotations[field_name] = ann
    call.__signature__ = inspect.Signature(params, return_annotation=dict[str, Any])  # type: ignore[attr-defined]
    call.__annotations__ = annotations
    call.__name__ = name
    return call


def build_mcp(tools: Tools, identity: Identity, tunnels: Any = None) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer(
        name="sandhold-gateway",
        instructions="Code execution in a per-session sandbox: files under /workspace persist "
        "for the whole session; publish results with publish_deliverable.",
    )
    for name in MODELS:
        server.add_tool(
            _tool(tools, name, identity),
            name=name,
            description=DESCRIPTIONS[name],
            structured_output=False,
        )
    if tunnels is not None:  # the tenant's tunnel tools beside these (sandhold.tunnel.tools)
        tunnels.attach(server, identity)
    return server
