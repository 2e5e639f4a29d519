"""The console of ``sandhold gateway serve``: sessions and their timelines, failures, usage by
tenant and scenario, live sandboxes. The admin key sees every tenant; a tenant key its own
only (the tenant it names is ignored: ``Principal.scope``)."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.routing import Route

from sandhold.console import gateway_sandboxes, queries, series
from sandhold.console.web import Handler, Principal, api_routes, limit, page_routes, text, window
from sandhold.errors import InvalidRequest, NotFound, SessionNotFound

if TYPE_CHECKING:
    from sandhold.gateway.app import Gateway


def routes(gw: Gateway) -> list[Route]:
    db = gw.manager.db  # runs a store query on a worker thread

    async def authenticate(key: str) -> Principal:
        admin = gw.settings.gateway_admin_key
        if admin and hmac.compare_digest(key.encode(), admin.encode()):
            return Principal("admin")
        return Principal("tenant", await gw.tenant_of_key(key))

    def scope(p: Principal, body: dict[str, Any]) -> tuple[str | None, str | None]:
        return p.scope(text(body, "tenant", 64)), text(body, "scenario", 64)

    async def sessions(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        tenant, scenario = scope(p, body)
        since, until = window(body, time.time())
        cursor = body.get("cursor")
        if cursor is not None and (isinstance(cursor, bool) or not isinstance(cursor, int)):
            raise InvalidRequest("cursor must be the integer a previous page gave")
        return await db(
            queries.sessions, gw.store, tenant, scenario, since, until, cursor, limit(body)
        )

    async def timeline(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        tenant, session = p.scope(text(body, "tenant", 64)), text(body, "session", 128)
        before = body.get("before")
        if tenant is None or session is None:
            raise InvalidRequest("tenant and session are required")
        if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
            raise InvalidRequest("before must be the integer a previous page gave")
        page = await db(queries.timeline, gw.store, tenant, session, before, limit(body, 200))
        if page is None:  # another tenant's session too: its existence is not revealed
            raise SessionNotFound(f"session {session!r} does not exist")
        return page

    async def kept_text(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        tenant, session = p.scope(text(body, "tenant", 64)), text(body, "session", 128)
        event, name = body.get("event"), text(body, "name", 16)
        if tenant is None or session is None or name not in queries.TEXTS:
            names = ", ".join(queries.TEXTS)
            raise InvalidRequest(f"tenant, session and name (one of {names}) are required")
        if isinstance(event, bool) or not isinstance(event, int):
            raise InvalidRequest("event must be an event's integer id")
        kept = await db(queries.text, gw.store, tenant, session, event, name)
        if kept is None:
            raise NotFound(f"event {event} of session {session!r} keeps no {name}")
        return kept

    async def failures(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
        tenant, scenario = scope(p, body)
        since, until = window(body, time.time())
        rows = await db(queries.failures, gw.store, tenant, scenario, since, until, limit(body))
        return {"failures": rows}

    def usage(read: Callable[..., dict[str, Any]]) -> Handler:
        """A report of the store's over a tenant's (or every tenant's) range: stats, series."""

        async def handler(p: Principal, body: dict[str, Any]) -> dict[str, Any]:
            tenant, scenario = scope(p, body)
            since, until = window(body, time.time())
            return await db(read, gw.store, tenant, scenario, since, until)

        return handler

    handlers = {
        "sessions": sessions,
        "timeline": timeline,
        "text": kept_text,
        "failures": failures,
        "stats": usage(queries.stats),
        "series": usage(series.series),
        **gateway_sandboxes.handlers(gw),
    }
    return page_routes("gateway") + api_routes(authenticate, handlers)
