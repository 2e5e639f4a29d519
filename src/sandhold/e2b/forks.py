"""``POST /sandboxes/{id}/fork``: ``{"timeout"?, "count"?}`` → 201 with one entry per fork,
``{"sandbox": Sandbox}`` or ``{"error": {"code", "message"}}`` (each fork on its own)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from sandhold.e2b import models, wire
from sandhold.e2b.errors import e2b_status
from sandhold.errors import SandholdError
from sandhold.service import SandboxService
from sandhold.service.forks import fork


class Fork(models.Body):
    timeout: int | None = None
    count: int | None = None


async def answer(
    service: SandboxService, domain: str | None, team: str, sandbox_id: str, raw: bytes
) -> JSONResponse:
    body = models.parse(Fork, raw, empty_ok=True)
    results = await fork(service, team, sandbox_id, body.timeout, body.count)
    out: list[dict[str, Any]] = []
    for r in results:
        if isinstance(r, SandholdError):
            out.append({"error": {"code": e2b_status(r), "message": r.message}})
        else:
            out.append({"sandbox": wire.created(r, domain)})
    return JSONResponse(out, status_code=201)
