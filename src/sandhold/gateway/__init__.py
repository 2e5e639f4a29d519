"""The session gateway: gives every agent session a resident sandbox through a provider, runs
the three-stage lifecycle (create, keep-alive then auto-pause, reclaim), keeps workspaces and
deliverables, records the timeline, and serves the tools over MCP and REST."""
