"""The console of ``sandhold serve``: a team (its API key) sees its live sandboxes, with their
state, age, CPU, memory and disk (one fresh sample each); a sandbox's page, and kills and pauses
of its own sandboxes, audited (server_sandboxes.py); its templates, builds, snapshots and
volumes (server_catalog.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.routing import Route

from sandhold.audit import CONSOLE_FIELDS, AuditLog, console_dir
from sandhold.console import server_catalog, server_sandboxes
from sandhold.console.web import Principal, api_routes, fresh_sample, page_routes, usage
from sandhold.e2b.auth import Teams
from sandhold.e2b.volumes import VolumeStore
from sandhold.service import SandboxService


def routes(service: SandboxService, teams: Teams) -> list[Route]:
    async def authenticate(key: str) -> Principal:
        return Principal("tenant", teams.team_of({"x-api-key": key}))

    async def sandboxes(principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        mine = await service.query(principal.tenant)

        async def row(sbx: Any) -> dict[str, Any]:
            out: dict[str, Any] = {
                "sandbox_id": sbx.id,
                "tenant": sbx.owner,
                "template": sbx.info.template,
                "state": sbx.state,
                "age_s": round(now - sbx.info.created_at, 1),
            }
            if (s := await fresh_sample(service, sbx)) is not None:
                out.update(usage(s))
            return out

        rows = await asyncio.gather(*(row(s) for s in mine[:500]))
        return {"sandboxes": sorted(rows, key=lambda r: -r["age_s"])}

    # The same store as E2B's /volumes (its records are files: no state is shared in memory).
    volumes = VolumeStore(service.settings)
    audit = AuditLog(console_dir(service.settings.data_dir), CONSOLE_FIELDS)
    views = {
        "sandboxes": sandboxes,
        **server_sandboxes.handlers(service, audit),
        **server_catalog.handlers(service, volumes),
    }
    return page_routes("server") + api_routes(authenticate, views)
