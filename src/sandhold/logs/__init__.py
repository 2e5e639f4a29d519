"""Structured logs: JSON lines with the request, tenant, session and sandbox ids, written to
size-rotated files under the data directory (``<log_path>/<component>.jsonl``) and to stderr.

- ``setup(settings, component)`` once per serving process (``sandhold serve``: ``"server"``,
  ``sandhold gateway serve``: ``"gateway"``), before uvicorn is configured with
  ``log_config=None``;
- ``RequestLog`` around the ASGI app: a request id per request, one line per request;
- ``bind`` / ``bound`` / ``update`` for the ids of the code that runs (``context``);
- ``read`` for ``sandhold logs``.

See docs/observability.md.

Modules:

- ``context.py``: The ids a log record carries, bound per request (or per task) in a context
  variable
- ``middleware.py``: ``RequestLog``: the ASGI middleware that gives every HTTP request an id and
  logs one line
- ``read.py``: Reading the JSON-lines files back (``sandhold logs``)
- ``setup.py``: Where log records go: JSON lines in ``<log_path>/<component>.jsonl``
"""

from __future__ import annotations

from sandhold.logs.context import ID_FIELDS, Ids, bind, bound, current, reset, update
from sandhold.logs.middleware import RequestLog, new_request_id
from sandhold.logs.setup import JsonFormatter, log_file, setup

__all__ = [
    "ID_FIELDS",
    "Ids",
    "JsonFormatter",
    "RequestLog",
    "bind",
    "bound",
    "current",
    "log_file",
    "new_request_id",
    "reset",
    "setup",
    "update",
]
