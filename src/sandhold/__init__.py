"""Sandhold: a self-hosted code-execution layer for AI agents (docs/architecture.md is the map
of its packages).

Modules:

- ``audit.py``: Audit logs: one JSON line per event, in a file per UTC day under a directory
- ``demo.py``: `make run`: start the E2B-compatible server on the embedded defaults
- ``errors.py``: The one exception tree of the host side
- ``http_edge.py``: The HTTP edge's small toolkit: bearer tokens, bounded bodies, JSON objects
- ``isotime.py``: The one way a time goes on a wire: RFC 3339 in UTC with a ``Z``
- ``listening.py``: Serving on a listening socket someone else bound (``--fd``)
"""
