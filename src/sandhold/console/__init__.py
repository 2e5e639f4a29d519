"""The operator console: a web page served by ``sandhold gateway serve`` (usage and failures
over time by tenant and scenario, sessions, timelines of what ran, sandboxes, guarded actions),
by ``sandhold serve`` (sandboxes, templates and builds, snapshots, volumes) and by ``sandhold
edge serve`` (the fleet's hosts and sandboxes), behind the admin key or a tenant key. ``web``
serves the page and the API's plumbing; ``server``, ``gateway`` and ``edge`` answer its
queries. See docs/console.md.

Modules:

- ``edge.py``: The console of ``sandhold edge serve``: the fleet's hosts, and where each
  sandbox is
- ``gateway.py``: The console of ``sandhold gateway serve``
- ``gateway_sandboxes.py``: The gateway console's sandboxes: the live ones, one sandbox's page
  and the guarded actions on a session
- ``queries.py``: The gateway console's reads of the store
- ``series.py``: Usage over time for the console's charts (rollups plus raw events)
- ``server.py``: The console of ``sandhold serve``
- ``server_catalog.py``: What a team keeps on ``sandhold serve``: its templates, their builds
  and logs, its snapshots and volumes
- ``server_sandboxes.py``: A sandbox's page in ``sandhold serve``'s console, and the guarded
  actions (kill, pause) on it, audited
- ``web.py``: The console's page, its static files and the plumbing of its JSON API, for any server
"""
