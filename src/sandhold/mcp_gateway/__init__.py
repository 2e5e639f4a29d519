"""E2B's MCP gateway: the ``mcp-gateway`` command of the ``mcp-gateway`` template.

``Sandbox.create(mcp={...})`` (the official SDK) creates the sandbox from ``mcp-gateway`` and
runs ``mcp-gateway --config '<json>'`` in it as root, with ``GATEWAY_ACCESS_TOKEN`` set. The
command starts every MCP server named in the config as a stdio subprocess (with the official
``mcp`` client), serves the union of their tools over MCP streamable HTTP on port 50005 at
``/mcp`` behind ``Authorization: Bearer <token>``, and returns once it serves; or it exits
non-zero naming each server it cannot run, having started nothing (the SDK then kills the
sandbox and raises "Failed to start MCP gateway: ...").

Modules: ``config`` (the option's shape, shared with the server's create check; and where a
server's command comes from: docs/mcp-gateway.md), ``gateway`` (the proxy), ``main`` (the
command: token, daemon) run inside the sandbox on its Python with the ``mcp`` SDK copied in;
``template`` (the template's build) runs on the host.
"""
