"""E2B's sandbox logs (what ``e2b sandbox logs <id>`` and the SDKs' log calls read), from the
sandbox's own log (runtime/sandbox_log.py: its agent's events, each process started and ended,
what its template's services printed):

- ``GET /sandboxes/{id}/logs?start=<ms>&limit=<n>`` (deprecated in E2B, still what the CLI
  reads): ``{logs: [{timestamp, line}], logEntries: [...]}``, oldest first; each ``line`` a JSON
  record (``level``, ``logger``, ``message``), as E2B's, which the CLI parses;
- ``GET /v2/sandboxes/{id}/logs?cursor=<ms>&limit=<n>&direction=&level=&search=``:
  ``{logs: [{timestamp, level, message, fields}]}``; forward from the cursor, or backward from
  it (the newest first, up to now by default).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold.e2b.models import int_param
from sandhold.errors import InvalidRequest
from sandhold.runtime import sandbox_log
from sandhold.runtime.sandbox_log import Entry
from sandhold.service import SandboxService
from sandhold.service.records import Sandbox

Handler = Callable[[Request, str], Awaitable[Response]]
LIMIT, MOST = 1000, 1000
LOGGER = "sandhold-agent"
DIRECTIONS = ("forward", "backward")
SEARCH_MAX = 256


def routes(
    service: SandboxService,
    authed: Callable[[Handler], Any],
    owned: Callable[[str, str], Awaitable[Sandbox]],
) -> list[Route]:
    async def entries(team: str, sandbox_id: str, since_ms: int) -> list[Entry]:
        sbx = await owned(team, sandbox_id)
        return await service.offload.run(sandbox_log.read, sbx.info.dir, since_ms)

    async def v1(request: Request, team: str) -> Response:
        start = int_param(request, "start") or 0
        limit = _limit(request)
        got = (await entries(team, request.path_params["id"], start))[:limit]
        record = [
            (e, json.dumps({"level": e.level, "logger": LOGGER, "message": e.message})) for e in got
        ]
        return JSONResponse(
            {
                "logs": [{"timestamp": _when(e), "line": line} for e, line in record],
                "logEntries": [_entry(e) for e in got],
            }
        )

    async def v2(request: Request, team: str) -> Response:
        direction = request.query_params.get("direction") or "forward"
        if direction not in DIRECTIONS:
            raise InvalidRequest(f"direction must be one of {', '.join(DIRECTIONS)}")
        level = request.query_params.get("level") or None
        if level is not None and level not in sandbox_log.ORDER:
            raise InvalidRequest(f"level must be one of {', '.join(sandbox_log.ORDER)}")
        search = request.query_params.get("search") or ""
        if len(search) > SEARCH_MAX:
            raise InvalidRequest(f"search is at most {SEARCH_MAX} characters")
        cursor, limit = int_param(request, "cursor"), _limit(request)
        if direction == "forward":
            got = await entries(team, request.path_params["id"], cursor or 0)
        else:
            until = cursor if cursor is not None else int(time.time() * 1000)
            got = [e for e in await entries(team, request.path_params["id"], 0) if e.at_ms <= until]
            got.reverse()
        got = [e for e in sandbox_log.at_least(got, level) if search in e.message][:limit]
        return JSONResponse({"logs": [_entry(e) for e in got]})

    return [
        Route("/sandboxes/{id}/logs", authed(v1), methods=["GET"]),
        Route("/v2/sandboxes/{id}/logs", authed(v2), methods=["GET"]),
    ]


def _limit(request: Request) -> int:
    limit = int_param(request, "limit")
    if limit is None:
        return LIMIT
    if not 0 <= limit <= MOST:
        raise InvalidRequest(f"limit must be between 0 and {MOST}")
    return limit


def _when(e: Entry) -> str:
    return datetime.fromtimestamp(e.at_ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _entry(e: Entry) -> dict[str, Any]:
    return {
        "timestamp": _when(e),
        "level": e.level,
        "message": e.message,
        "fields": {"logger": LOGGER},
    }
