"""``RequestLog``: the ASGI middleware that gives every HTTP request an id and logs one line for
it (``method``, ``path``, ``status``, ``duration_ms``, and the bound ids).

The id is the request's ``X-Request-Id`` if that is sane (``REQUEST_ID_RE``), else a new one; it
is bound for the request (``sandhold.logs.context``), so every record logged meanwhile carries
it, and returned in the response's ``X-Request-Id`` header (unless the response, e.g. a sandbox's
own web server, set one itself).

The line is written when the response's last body chunk is about to be sent: a client that saw a
response complete finds its line on disk, even if the server was killed right after. For a
stream (a command's output) that is when the stream ends.

Never logged: the query string (it carries file-URL signatures), headers (API keys, access
tokens) and bodies."""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sandhold.logs.context import Ids, bind, current, reset

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
Identify = Callable[[Scope, Ids], None]
Finish = Callable[[Scope, int | None, Ids, bytes | None], Awaitable[None]]

REQUEST_ID_RE = re.compile(rb"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_PATH = 512
MAX_CAPTURE = 64 * 1024
HEADER = b"x-request-id"

log = logging.getLogger("sandhold.request")


def new_request_id() -> str:
    return secrets.token_hex(8)


def incoming_request_id(headers: list[tuple[bytes, bytes]]) -> str | None:
    for key, value in headers:
        if key == HEADER:
            return value.decode("ascii") if REQUEST_ID_RE.match(value) else None
    return None


class RequestLog:
    """Wrap ``app``. ``identify(scope, ids)`` fills in the ids known from the request before it
    runs (a tenant from the API key, a sandbox from the path: cheap and synchronous);
    ``finish(scope, status, ids, body)`` those known only after it (a created sandbox's id,
    looked up owners), awaited before the line is written. ``body`` is the response body when
    ``capture(scope)`` asked for it (at most ``MAX_CAPTURE`` bytes; never logged). Requests for
    ``quiet`` paths (health checks) are logged at DEBUG."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        identify: Identify | None = None,
        finish: Finish | None = None,
        capture: Callable[[Scope], bool] | None = None,
        quiet: frozenset[str] = frozenset({"/health"}),
    ) -> None:
        self.app = app
        self.identify = identify
        self.finish = finish
        self.capture = capture
        self.quiet = quiet

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = incoming_request_id(scope["headers"]) or new_request_id()
        token = bind(request_id=rid, tenant=None, session=None, sandbox=None)
        ids = current() or Ids()
        if self.identify is not None:
            try:
                self.identify(scope, ids)
            except Exception:  # never the reason a request fails
                log.debug("identifying a request failed", exc_info=True)
        t0 = time.perf_counter()
        status: int | None = None
        logged = False
        body: bytearray | None = (
            bytearray() if self.capture is not None and self.capture(scope) else None
        )

        async def send_and_log(message: Message) -> None:
            nonlocal status, logged
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers") or [])
                if not any(k.lower() == HEADER for k, _ in headers):
                    headers.append((HEADER, rid.encode()))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if body is not None and len(body) + len(chunk) <= MAX_CAPTURE:
                    body.extend(chunk)
                if not message.get("more_body", False) and not logged:
                    await self._finish(scope, status, ids, body)
                    try:  # the response's last bytes go out first: the line is not in its time
                        await send(message)
                    finally:
                        logged = True
                        self._line(scope, status, t0)
                    return
            await send(message)

        try:
            await self.app(scope, receive, send_and_log)
        finally:  # no complete response: an error, a client that went away, a cancelled task
            if not logged:
                self._line(scope, status, t0)
            reset(token)

    async def _finish(
        self, scope: Scope, status: int | None, ids: Ids, body: bytearray | None
    ) -> None:
        if self.finish is None:
            return
        try:
            await self.finish(scope, status, ids, bytes(body) if body is not None else None)
        except Exception:
            log.debug("completing a request's ids failed", exc_info=True)

    def _line(self, scope: Scope, status: int | None, t0: float) -> None:
        duration_ms = round((time.perf_counter() - t0) * 1000, 1)
        path = scope.get("path", "")[:MAX_PATH]
        method = scope.get("method", "")
        if path in self.quiet:
            level = logging.DEBUG
        elif status is None or status >= 500:
            level = logging.WARNING
        else:
            level = logging.INFO
        if not log.isEnabledFor(level):
            return
        shown = status if status is not None else "no response"
        log.log(
            level,
            "%s %s %s %.1fms",
            method,
            path,
            shown,
            duration_ms,
            extra={"method": method, "path": path, "status": status, "duration_ms": duration_ms},
        )
