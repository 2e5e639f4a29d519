"""Structured logs: JSON lines with the request, tenant, session and sandbox ids, written to
size-rotated files under the data directory (``<log_path>/<component>.jsonl``) and to stderr.

- ``setup(settings, component)`` once per serving process (``sandhold serve``: ``"server"``,
  ``sandhold gateway serve``: ``"gateway"``), before uvicorn is configured with
  ``log_config=None``;
- ``RequestLog`` around the ASGI app: a request id per request, one line per request;
- ``bind`` / ``bound`` / ``update`` for the ids of the code that runs (``context``);
- ``read`` for ``sandhold logs``.

See docs/observability.md."""

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
