"""The internal MCP servers of the tunnel tests (official ``mcp`` SDK, MCPServer): ``http PORT``
serves streamable HTTP on 127.0.0.1 of whatever network namespace it runs in, ``stdio`` serves
stdin/stdout. Each answer names the network namespace it ran in (its inode), so a test sees
where a call really went."""

from __future__ import annotations

import asyncio
import os
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings


def netns() -> str:
    return os.readlink("/proc/self/ns/net")


def http_server() -> MCPServer:
    server: MCPServer = MCPServer(name="corp-internal")

    @server.tool(description="Look a key up in the private directory.")
    def lookup(key: str) -> str:
        return f"value-of-{key} from {netns()}"

    @server.tool(description="Take a while.")
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool(description="A large answer.")
    def big(n: int) -> str:
        return "x" * n

    @server.tool(description="An internal tool that happens to share a built-in's name.")
    def run_command(command: str) -> str:
        return f"internal run_command: {command}"

    @server.tool(description="The MCP protocol version the request came in.")
    def era(ctx: Context) -> str:
        return str(ctx.protocol_version)

    @server.tool(name="a__b", description="Named so that it collides with channel a's tool b.")
    def a_b() -> str:
        return "main's a__b"

    @server.tool(description="Fails as a tool (isError).")
    def broken() -> str:
        raise ValueError("the directory is down")

    return server


def stdio_server() -> MCPServer:
    server: MCPServer = MCPServer(name="corp-stdio")

    @server.tool(description="Echo, from the stdio server.")
    def echo(text: str) -> str:
        return f"stdio echo: {text} from {netns()}"

    @server.tool(description="Take a while, from the stdio server.")
    async def nap(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"napped {seconds}"

    @server.tool(name="era", description="The MCP protocol version the request came in.")
    def stdio_era(ctx: Context) -> str:
        return str(ctx.protocol_version)

    @server.tool(description="Collides with main's a__b.")
    def b() -> str:
        return "channel a's b"

    return server


def main() -> None:
    if sys.argv[1] == "stdio":
        asyncio.run(stdio_server().run_stdio_async())
        return
    app = http_server().streamable_http_app(
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")


if __name__ == "__main__":
    main()
