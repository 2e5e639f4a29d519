"""The operator console: a web page served by ``sandhold gateway serve`` (sessions, timelines,
usage and failures by tenant and scenario, live sandboxes) and by ``sandhold serve`` (live
sandboxes), behind the admin key or a tenant key. ``web`` serves the page and the API's
plumbing; ``server`` and ``gateway`` answer its queries. See docs/console.md.

Modules:

- ``gateway.py``: The console of ``sandhold gateway serve``
- ``queries.py``: The gateway console's reads of the store
- ``server.py``: The console of ``sandhold serve``
- ``web.py``: The console's page, its static files and the plumbing of its JSON API, for any server
"""
