"""The sandbox worker (``sandhold worker``, docs/worker.md): serves a self-hosted environment of a
Claude-Managed-Agents-compatible control plane with the ``anthropic`` SDK's worker loop, running
each session's built-in tools in the session's Sandhold sandbox through the gateway."""
