"""The console of ``sandhold edge serve``: the fleet's hosts (capacity, use, draining, lost, what
each holds) for the operator, and the sandboxes with the host that holds each, from the catalog.

The operator signs in with ``server_metrics_token`` (the credential that already reads the
edge's ``/metrics``); a team with its API key sees its own sandboxes and not the hosts."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from starlette.routing import Route

from sandhold.console.web import Principal, api_routes, limit, page_routes
from sandhold.errors import Forbidden

if TYPE_CHECKING:
    from sandhold.config import Settings
    from sandhold.e2b.auth import Teams
    from sandhold.fleet.catalog import Catalog
    from sandhold.fleet.members import Members

MOST = 1000  # sandboxes listed at once


def routes(settings: Settings, teams: Teams, catalog: Catalog, members: Members) -> list[Route]:
    async def authenticate(key: str) -> Principal:
        token = settings.server_metrics_token
        if token and hmac.compare_digest(key.encode(), token.encode()):
            return Principal("admin")
        return Principal("tenant", teams.team_of({"x-api-key": key}))

    async def hosts(principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        if principal.kind != "admin":
            raise Forbidden("the hosts are the operator's to see (server_metrics_token)")
        rows = await asyncio.to_thread(catalog.hosts)
        held = Counter(r.host_id for r in await asyncio.to_thread(catalog.listing, None))
        now = time.time()
        out = []
        for h in sorted(rows, key=lambda h: h.host_id):
            live = members.live.get(h.host_id)
            info = live if live is not None else h.info
            out.append(
                {
                    "host_id": h.host_id,
                    "address": h.address,
                    "state": h.state if live is not None or h.state == "lost" else "silent",
                    "capacity": h.capacity,
                    "used": info.get("used"),
                    "unstored": info.get("unstored"),
                    "sandboxes": held.get(h.host_id, 0),
                    "version": info.get("version"),
                    "seen_s_ago": round(now - h.last_seen, 1),
                }
            )
        return {"hosts": out}

    async def sandboxes(principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        team = principal.scope(None)
        rows = await asyncio.to_thread(catalog.listing, team, limit(body, MOST, MOST))
        now = time.time()
        return {
            "sandboxes": [
                {
                    "sandbox_id": r.sandbox_id,
                    "tenant": r.team,
                    "template": r.listed.get("templateID") or r.listed.get("alias"),
                    "state": r.state if r.host_id is not None else "stored",
                    "host": r.host_id,
                    "age_s": round(now - r.started_at, 1),
                }
                for r in rows
            ]
        }

    return page_routes("edge") + api_routes(authenticate, {"hosts": hosts, "sandboxes": sandboxes})
