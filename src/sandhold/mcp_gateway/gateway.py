"""The gateway: every configured MCP server started as a stdio subprocess with the official
``mcp`` client, the union of their tools served over MCP streamable HTTP (the official ``mcp``
server) behind a bearer token.

Tool names are the servers' own, unprefixed (as E2B's Docker gateway exposes them); two servers
offering the same name is a start-up failure naming both.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import uvicorn
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import JSONResponse

from .config import ServerSpec

START_TIMEOUT_S = 45.0  # a server's handshake and tool list (the SDK's command waits 60 s)
LOG_DIR = Path("/var/log/mcp-gateway")
TAIL = 600


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    out = " | ".join(lines[-4:])
    return out[-TAIL:] or "(no output)"


def _describe(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_describe(x) for x in e.exceptions)
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


async def prepare(spec: ServerSpec) -> str | None:
    """Clone a github/... server and run its install command; the failure's line, or None."""
    if spec.clone_url is None or spec.cwd is None:
        return None
    work = Path(spec.cwd)
    shutil.rmtree(work, ignore_errors=True)
    work.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    clone = await anyio.run_process(
        ["git", "clone", "--depth", "1", "--quiet", spec.clone_url, str(work)],
        env=env,
        check=False,
        stdin=None,
    )
    if clone.returncode != 0:
        why = _tail(clone.stderr.decode(errors="replace"))
        return f"MCP server '{spec.name}': git clone {spec.clone_url} failed: {why}"
    if spec.install_cmd:
        inst = await anyio.run_process(
            ["/bin/bash", "-c", spec.install_cmd],
            cwd=work,
            env={**os.environ, **spec.env},
            check=False,
            stdin=None,
            stderr=subprocess.STDOUT,
        )
        if inst.returncode != 0:
            why = _tail(inst.stdout.decode(errors="replace"))
            return f"MCP server '{spec.name}': install_cmd failed (exit {inst.returncode}): {why}"
    return None


class Upstream:
    """One MCP server: its process and client session, held open by ``run`` until ``stop``."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.client: Client | None = None
        self.tools: list[types.Tool] = []
        self.error: str | None = None
        self.ready = anyio.Event()
        self.stop = anyio.Event()
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log = LOG_DIR / (re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name) + ".log")

    async def run(self) -> None:
        params = StdioServerParameters(
            command=self.spec.command[0],
            args=self.spec.command[1:],
            env=self.spec.env,
            cwd=self.spec.cwd,
        )
        try:
            with open(self.log, "w") as errlog:
                async with Client(stdio_client(params, errlog=errlog), cache=None) as c:
                    cursor: str | None = None
                    while True:
                        page = await c.list_tools(cursor=cursor)
                        self.tools += page.tools
                        if not (cursor := page.next_cursor):
                            break
                    self.client = c
                    self.ready.set()
                    await self.stop.wait()
        except Exception as e:  # ExceptionGroups of the transport's task group too
            self.error = f"MCP server '{self.spec.name}' did not start: {_describe(e)}"
            with contextlib.suppress(OSError):
                self.error += f" (stderr: {_tail(self.log.read_text(errors='replace'))})"
        finally:
            self.client = None
            self.ready.set()


def proxy(upstreams: list[Upstream]) -> tuple[Server[Any], list[str]]:
    """The MCP server of the union of the upstreams' tools; and the duplicate names, if any."""
    owner: dict[str, Upstream] = {}
    errors = []
    for up in upstreams:
        for tool in up.tools:
            if tool.name in owner:
                errors.append(
                    f"tool '{tool.name}' is offered by both MCP server "
                    f"'{owner[tool.name].spec.name}' and '{up.spec.name}'"
                )
            else:
                owner[tool.name] = up
    tools = [t for up in upstreams for t in up.tools]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        up = owner.get(params.name)
        client = up.client if up else None
        if up is None or client is None:
            why = "no such tool" if up is None else f"MCP server '{up.spec.name}' has stopped"
            text = types.TextContent(type="text", text=f"tool {params.name!r}: {why}")
            return types.CallToolResult(content=[text], is_error=True)
        return await client.call_tool(params.name, params.arguments)

    return Server("sandhold-mcp-gateway", on_list_tools=list_tools, on_call_tool=call_tool), errors


def bearer_guard(app: Any, token: str) -> Any:
    """``app`` answering HTTP requests without ``Authorization: Bearer <token>`` with 401."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                refusal = JSONResponse(
                    {
                        "error": "unauthorized",
                        "message": "a valid Authorization: Bearer token "
                        "is required (the sandbox's MCP token)",
                    },
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await refusal(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


async def serve(
    specs: list[ServerSpec],
    token: str,
    host: str,
    port: int,
    report: Callable[[list[str], int], None],
) -> None:
    """Start the servers and serve their tools; ``report(errors, n_tools)`` once, when serving
    (no errors) or when something could not start (then nothing is left running)."""
    errors = [e for spec in specs if (e := await prepare(spec)) is not None]
    if errors:
        report(errors, 0)
        return
    upstreams = [Upstream(s) for s in specs]
    async with anyio.create_task_group() as tg:
        for up in upstreams:
            tg.start_soon(up.run)
        with anyio.move_on_after(START_TIMEOUT_S):
            for up in upstreams:
                await up.ready.wait()
        for up in upstreams:
            if up.error:
                errors.append(up.error)
            elif not up.ready.is_set():
                errors.append(
                    f"MCP server '{up.spec.name}' did not answer within {START_TIMEOUT_S:.0f} s"
                )
        server, duplicates = proxy(upstreams)
        errors += duplicates
        sock = None
        if not errors:
            try:
                sock = socket.create_server((host, port), reuse_port=False, backlog=128)
            except OSError as e:
                errors.append(f"cannot listen on {host}:{port}: {e.strerror or e}")
        if errors:
            tg.cancel_scope.cancel()
        else:
            assert sock is not None
            failed = await _serve_http(tg, server, sock, token, upstreams, report)
            if failed:
                errors.append(f"the MCP endpoint on {host}:{port} did not start")
                tg.cancel_scope.cancel()
    if errors:  # reported once every server started has stopped
        report(errors, 0)


async def _serve_http(
    tg: anyio.abc.TaskGroup,
    server: Server[Any],
    sock: socket.socket,
    token: str,
    upstreams: list[Upstream],
    report: Callable[[list[str], int], None],
) -> bool:
    """Serve ``/mcp`` on ``sock`` in ``tg``; report once it serves. True if it did not start."""
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=True,
        json_response=True,
        host="0.0.0.0",
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    web = uvicorn.Server(
        uvicorn.Config(bearer_guard(app, token), log_level="warning", lifespan="on")
    )
    tg.start_soon(web.serve, [sock])
    while not web.started and not web.should_exit:
        await anyio.sleep(0.02)
    if not web.started:
        return True
    report([], sum(len(up.tools) for up in upstreams))
    return False
