"""E2B's ``/secrets``: a team's named values for its sandboxes' ``network.rules``
(``${e2b.secrets.NAME}``), stored sealed in the egress secret store
(``sandhold.egress.secret_values``). No answer carries a value.

``GET /secrets?limit=&nextToken=`` → 200 ``[Secret]`` (``X-Next-Token`` while more remain);
``POST /secrets`` → 201; ``GET|POST|DELETE /secrets/{id or name}`` → 200, 200, 204.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold import http_edge
from sandhold.config import Settings
from sandhold.e2b import models
from sandhold.egress.secret_values import SecretValues, ValueInfo
from sandhold.egress.secrets import open_store
from sandhold.errors import InvalidRequest
from sandhold.isotime import iso

MAX_PAGE = 100


class NewSecret(models.Body):
    name: str
    value: str
    metadata: dict[str, str] | None = None


class SecretUpdate(models.Body):
    value: str
    metadata: dict[str, str] | None = None


_STORES: dict[tuple[object, ...], SecretValues] = {}  # one per configuration of the ring


def values_of(settings: Settings) -> SecretValues:
    """The server's E2B secrets (the egress daemon reads the same file)."""
    s = settings
    kms = (s.secrets_kms_key_id, s.secrets_kms_endpoint_url, s.secrets_kms_region)
    where = (s.data_dir, tuple(s.secrets_keys), s.secrets_key_file, *kms)
    if where not in _STORES:
        _STORES[where] = open_store(s).values
    return _STORES[where]


def public(info: ValueInfo) -> dict[str, Any]:
    return {
        "secretID": info.id,
        "name": info.name,
        "currentVersion": info.version,
        "metadata": info.metadata,
        "createdAt": iso(info.created_at),
        "updatedAt": iso(info.updated_at),
    }


class SecretRoutes:
    """E2B's secrets endpoints for a team, over the server's secret values."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def listed(self, request: Request, team: str) -> Response:
        q = request.query_params
        try:
            limit, start = int(q.get("limit") or MAX_PAGE), int(q.get("nextToken") or 0)
        except ValueError:
            raise InvalidRequest("limit and nextToken must be integers") from None
        if not 1 <= limit <= MAX_PAGE or start < 0:
            raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}")
        every = values_of(self.settings).list(team)
        page = every[start : start + limit]
        more = {"X-Next-Token": str(start + limit)} if start + limit < len(every) else {}
        return JSONResponse([public(s) for s in page], headers=more)

    async def create(self, request: Request, team: str) -> Response:
        body = models.parse(
            NewSecret, await http_edge.read_body(request, self.settings.server_max_body_bytes)
        )
        info = values_of(self.settings).create(team, body.name, body.value, body.metadata)
        return JSONResponse(public(info), status_code=201)

    async def get(self, request: Request, team: str) -> Response:
        return JSONResponse(public(values_of(self.settings).get(team, request.path_params["id"])))

    async def update(self, request: Request, team: str) -> Response:
        body = models.parse(
            SecretUpdate, await http_edge.read_body(request, self.settings.server_max_body_bytes)
        )
        info = values_of(self.settings).update(
            team, request.path_params["id"], body.value, body.metadata
        )
        return JSONResponse(public(info))

    async def delete(self, request: Request, team: str) -> Response:
        values_of(self.settings).delete(team, request.path_params["id"])
        return Response(status_code=204)

    def routes(self, authed: Callable[[Any], Any]) -> list[Route]:
        return [
            Route("/secrets", authed(self.listed), methods=["GET"]),
            Route("/secrets", authed(self.create), methods=["POST"]),
            Route("/secrets/{id}", authed(self.get), methods=["GET"]),
            Route("/secrets/{id}", authed(self.update), methods=["POST"]),
            Route("/secrets/{id}", authed(self.delete), methods=["DELETE"]),
        ]


def routes(settings: Settings, authed: Callable[[Any], Any]) -> list[Route]:
    return SecretRoutes(settings).routes(authed)
