"""The operator console: a web page served by ``sandhold gateway serve`` (sessions, timelines,
usage and failures by tenant and scenario, live sandboxes), by ``sandhold serve`` (live
sandboxes) and by ``sandhold edge serve`` (the fleet's hosts and sandboxes), behind the admin
key or a tenant key. ``web`` serves the page and the API's plumbing; ``server``, ``gateway``
and ``edge`` answer its queries. See docs/console.md.

Modules:

- ``edge.py``: The console of ``sandhold edge serve``: the fleet's hosts, and where each
  sandbox is
- ``gateway.py``: The console of ``sandhold gateway serve``
- ``queries.py``: The gateway console's reads of the store
- ``series.py``: Usage over time for the console's charts (rollups plus raw events)
- ``server.py``: The console of ``sandhold serve``
- ``server_catalog.py``: What a team keeps on ``sandhold serve``: its templates, their builds
  and logs, its snapshots and volumes
- ``server_sandboxes.py``: A sandbox's page in ``sandhold serve``'s console, and the guarded
  actions (kill, pause) on it, audited
- ``web.py``: The console's page, its static files and the plumbing of its JSON API, for any server
"""
