"""The sandbox worker (``sandhold worker``, docs/worker.md): serves a self-hosted environment of a
Claude-Managed-Agents-compatible control plane with the ``anthropic`` SDK's worker loop, running
each session's built-in tools in the session's Sandhold sandbox through the gateway.

Modules:

- ``gateway.py``: The worker's side of the Sandhold gateway: its REST tools, called for one session
- ``runner.py``: ``sandhold worker``: the ``anthropic`` SDK's environment worker with its tools in
  Sandhold
- ``sandbox_search.py``: The ``glob`` and ``grep`` tools' program
- ``shell.py``: The ``bash`` tool's persistent shell, kept in the sandbox rather than in the worker
- ``tools.py``: The ``agent_toolset_20260401`` tools
"""
