"""The session gateway: gives every agent session a resident sandbox through a provider, runs
the three-stage lifecycle (create, keep-alive then auto-pause, reclaim), keeps workspaces and
deliverables, records the timeline, and serves the tools over MCP and REST.

Modules:

- ``app.py``: The gateway assembled: store, provider, session manager, reclaimer, deliverables,
  tools
- ``creates.py``: The base of the session manager
- ``deliverables.py``: The deliverables store: files an agent publishes outlive the session's
  sandbox and workspace
- ``errors.py``: The gateway's wire tables
- ``handles.py``: Provider handles at rest
- ``keep_alive.py``: Restoring a session's keep-alive after a tool call, with a little slack
- ``keys.py``: Tenant API keys → their tenant and policy, cached briefly
  (``gateway_auth_cache_ttl_s``)
- ``lifecycle.py``: The reclaimer: the third stage of the lifecycle, run by every replica (default
  every 60 s)
- ``mcp_server.py``: The tools over MCP, with the official ``mcp`` SDK: stdio and streamable HTTP
- ``policy.py``: Per-tenant policy: everything about a session's sandbox that the operator decides
  and a
- ``prom.py``: Prometheus metrics of ``sandhold gateway serve`` (``GET /metrics``)
- ``rest.py``: The REST API (and the MCP streamable-HTTP endpoint on the same port), with an OpenAPI
  schema
- ``scenario.py``: A session's scenario: a label the platform gives its sessions
- ``server.py``: Running the gateway: ``sandhold gateway serve``
- ``sessions.py``: The SandboxSessionManager: maps each agent session to at most one sandbox of a
  provider
- ``texts.py``: What a tool call ran and printed, as the timeline keeps it for the console
- ``timeline.py``: The timeline: every event of a session, with its tenant, duration and what
  justified it
- ``tool_args.py``: The tools' arguments: one model per tool
- ``tools.py``: The tools an agent loop calls, shared by the MCP and REST surfaces
- ``views.py``: A session's file view: what of the host a session's sandbox sees
"""
