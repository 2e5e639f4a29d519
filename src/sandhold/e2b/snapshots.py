"""E2B's snapshot endpoints over the service's snapshots (service/snapshots.py):
``POST /sandboxes/{id}/snapshots`` ``{"name"?, "memory"?}`` → 201 ``SnapshotInfo``;
``GET /snapshots?sandboxID=&name=&limit=&nextToken=`` → 200 ``[SnapshotInfo]``;
``DELETE /templates/{id}`` (what the SDK's ``delete_snapshot`` sends) → 204. A snapshot's id is
also what ``Sandbox.create`` takes as its template."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from sandhold.e2b import models
from sandhold.errors import InvalidRequest
from sandhold.runtime.checkpoint.snapshots import Snapshot
from sandhold.runtime.spec import NAME_RE
from sandhold.service import SandboxService
from sandhold.service import snapshots as service_snapshots

MAX_PAGE = 100


class SnapshotRequest(models.Body):
    name: str | None = None
    memory: bool | None = None


def info(snap: Snapshot) -> dict[str, Any]:
    return {"snapshotID": snap.id, "names": list(snap.names)}


async def create(service: SandboxService, team: str, sandbox_id: str, raw: bytes) -> Response:
    body = models.parse(SnapshotRequest, raw, empty_ok=True)
    if body.name is not None and not NAME_RE.match(body.name):
        raise InvalidRequest(f"invalid snapshot name {body.name!r}")
    snap = await service_snapshots.take(service, team, sandbox_id, body.name, body.memory)
    return JSONResponse(info(snap), status_code=201)


async def listed(service: SandboxService, team: str, query: dict[str, str]) -> Response:
    try:
        limit = int(query.get("limit") or MAX_PAGE)
        start = int(query.get("nextToken") or 0)
    except ValueError:
        raise InvalidRequest("limit and nextToken must be integers") from None
    if not 1 <= limit <= MAX_PAGE or start < 0:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}")
    snaps = await service_snapshots.listed(
        service, team, query.get("sandboxID") or None, query.get("name") or None
    )
    page = snaps[start : start + limit]
    headers = {"X-Next-Token": str(start + limit)} if start + limit < len(snaps) else {}
    return JSONResponse([info(s) for s in page], headers=headers)


async def delete(service: SandboxService, team: str, ref: str) -> Response:
    await service_snapshots.delete(service, team, ref)
    return Response(status_code=204)
