"""The control plane: E2B's REST API (v2 and the v1 forms) over the runtime.

Status codes and bodies follow what the pinned SDK parses (see the wire-protocol reference): a
wrong success code makes the SDK fail with "Body of the request is None", and every error needs
a JSON ``{code, message}`` body.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold.e2b import models
from sandhold.e2b.auth import Teams
from sandhold.e2b.errors import ApiError, error_response, from_sandhold
from sandhold.e2b.sandboxes import Sandbox, Sandboxes
from sandhold.e2b.volumes import VolumeStore
from sandhold.errors import SandholdError

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_PAGE = 100
MAX_METRICS_IDS = 100

Handler = Callable[[Request, str], Awaitable[Response]]


async def read_body(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_metadata_filter(raw: str) -> dict[str, str]:
    """Undo the SDK's encoding: it ``quote()``s each key and value, ``urlencode()``s the pairs
    into one string and sends that as one (again encoded) query value."""
    out: dict[str, str] = {}
    for pair in unquote(raw).split("&"):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep:
            raise ApiError(400, f"invalid metadata filter {pair!r}: expected key=value")
        out[unquote(key)] = unquote(value)
    return out


def encode_token(sbx: Sandbox) -> str:
    raw = f"{sbx.info.created_at!r}__{sbx.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        started, _, sandbox_id = raw.partition("__")
        return float(started), sandbox_id
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise ApiError(400, f"invalid nextToken {token!r}") from None


def int_param(request: Request, name: str) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ApiError(400, f"query parameter {name!r} must be an integer, got {value!r}") from None


class ControlPlane:
    def __init__(self, sandboxes: Sandboxes, volumes: VolumeStore, teams: Teams) -> None:
        self.sandboxes = sandboxes
        self.volumes = volumes
        self.teams = teams

    def authed(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await handler(request, self.teams.team_of(request.headers))

        return endpoint

    def app(self, lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]
            ) -> Starlette:  # fmt: skip
        a = self.authed
        unsupported = a(self.unsupported)
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v2/sandboxes", a(self.create_v2), methods=["POST"]),
            Route("/v2/sandboxes", a(self.list_v2), methods=["GET"]),
            Route("/sandboxes", a(self.create_v1), methods=["POST"]),
            Route("/sandboxes", a(self.list_v1), methods=["GET"]),
            Route("/sandboxes/metrics", a(self.batch_metrics), methods=["GET"]),
            Route("/sandboxes/{id}", a(self.get_info), methods=["GET"]),
            Route("/sandboxes/{id}", a(self.kill), methods=["DELETE"]),
            Route("/v2/sandboxes/{id}/connect", a(self.connect_v2), methods=["POST"]),
            Route("/sandboxes/{id}/connect", a(self.connect_v1), methods=["POST"]),
            Route("/sandboxes/{id}/resume", a(self.resume), methods=["POST"]),
            Route("/sandboxes/{id}/pause", a(self.pause), methods=["POST"]),
            Route("/sandboxes/{id}/timeout", a(self.set_timeout), methods=["POST"]),
            Route("/sandboxes/{id}/refreshes", a(self.refresh), methods=["POST"]),
            Route("/sandboxes/{id}/metrics", a(self.metrics), methods=["GET"]),
            Route("/sandboxes/{id}/network", a(self.update_network), methods=["PUT"]),
            Route("/volumes", a(self.create_volume), methods=["POST"]),
            Route("/volumes", a(self.list_volumes), methods=["GET"]),
            Route("/volumes/{id}", a(self.get_volume), methods=["GET"]),
            Route("/volumes/{id}", a(self.delete_volume), methods=["DELETE"]),
            # Known E2B endpoints this server does not implement: say so instead of 404.
            Route("/sandboxes/{id}/snapshots", unsupported, methods=["POST"]),
            Route("/snapshots", unsupported, methods=["GET"]),
            Route("/sandboxes/{id}/fork", unsupported, methods=["POST"]),
            Route("/sandboxes/{id}/logs", unsupported, methods=["GET"]),
            Route("/v2/sandboxes/{id}/logs", unsupported, methods=["GET"]),
        ]
        return Starlette(
            routes=routes,
            lifespan=lifespan,
            exception_handlers={
                ApiError: _api_error,
                SandholdError: _sandhold_error,
                HTTPException: _http_error,
                Exception: _internal_error,
            },
        )

    # -- sandboxes ----------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def unsupported(self, request: Request, team: str) -> Response:
        raise ApiError(501, f"{request.method} {request.url.path} is not supported by this server")

    async def _create(self, request: Request, team: str, v1: bool) -> Response:
        raw = await read_body(request)
        body = models.parse(models.NewSandboxV1 if v1 else models.NewSandbox, raw)
        key = request.headers.get("idempotency-key") or None
        if key is not None and not 1 <= len(key) <= 255:
            raise ApiError(400, "Idempotency-Key must be 1-255 characters")
        sbx = await self.sandboxes.create(team, body, v1=v1, idempotency_key=key)
        return JSONResponse(sbx.to_sandbox(self.sandboxes.domain), status_code=201)

    async def create_v2(self, request: Request, team: str) -> Response:
        return await self._create(request, team, v1=False)

    async def create_v1(self, request: Request, team: str) -> Response:
        return await self._create(request, team, v1=True)

    def _filtered(
        self, request: Request, team: str, states: set[str], sandboxes: list[Sandbox]
    ) -> list[Sandbox]:
        q = request.query_params
        metadata = parse_metadata_filter(q["metadata"]) if q.get("metadata") else {}
        started_after: float | None = None
        if q.get("startedAfter"):
            try:
                started_after = datetime.fromisoformat(q["startedAfter"]).timestamp()
            except ValueError:
                raise ApiError(400, f"invalid startedAfter {q['startedAfter']!r}") from None
        template = q.get("template")
        out = []
        for sbx in sandboxes:
            if sbx.st.team != team or sbx.info.state not in states:
                continue
            if any(sbx.info.metadata.get(k) != v for k, v in metadata.items()):
                continue
            if started_after is not None and sbx.info.created_at < started_after:
                continue
            if template and sbx.info.template != template:
                continue
            out.append(sbx)
        return out

    async def list_v2(self, request: Request, team: str) -> Response:
        q = request.query_params
        states = {"running", "paused"}
        if q.get("state"):
            states = set(q["state"].split(","))
            bad = states - {"running", "paused"}
            if bad:
                raise ApiError(400, f"invalid state {sorted(bad)[0]!r}: use running or paused")
        order = q.get("order") or "desc"
        if order not in ("asc", "desc"):
            raise ApiError(400, f"invalid order {order!r}: use asc or desc")
        limit = int_param(request, "limit")
        limit = MAX_PAGE if limit is None else limit
        if not 1 <= limit <= MAX_PAGE:
            raise ApiError(400, f"limit must be between 1 and {MAX_PAGE}")
        everything = self.sandboxes.all()
        items = sorted(
            self._filtered(request, team, states, everything),
            key=lambda s: (s.info.created_at, s.id),
            reverse=order == "desc",
        )
        if q.get("nextToken"):
            cursor = decode_token(q["nextToken"])
            if order == "desc":
                items = [s for s in items if (s.info.created_at, s.id) < cursor]
            else:
                items = [s for s in items if (s.info.created_at, s.id) > cursor]
        page = items[:limit]
        running = sum(s.running for s in everything if s.st.team == team)
        headers = {"X-Total-Running": str(running)}
        if len(items) > limit:
            headers["X-Next-Token"] = encode_token(page[-1])
        size = self.sandboxes.disk_size_mb
        return JSONResponse([s.to_listed(size) for s in page], headers=headers)

    async def list_v1(self, request: Request, team: str) -> Response:
        items = self._filtered(request, team, {"running"}, self.sandboxes.all())
        items.sort(key=lambda s: (s.info.created_at, s.id), reverse=True)
        size = self.sandboxes.disk_size_mb
        return JSONResponse([s.to_listed(size) for s in items])

    async def get_info(self, request: Request, team: str) -> Response:
        sbx = self.sandboxes.owned(team, request.path_params["id"])
        return JSONResponse(sbx.to_detail(self.sandboxes.disk_size_mb, self.sandboxes.domain))

    async def kill(self, request: Request, team: str) -> Response:
        # Sandhold's conditional kill (see Sandboxes.kill); E2B clients send neither header.
        if_end_at = None
        if raw := request.headers.get("x-sandhold-if-end-at"):
            try:
                if_end_at = datetime.fromisoformat(raw).timestamp()
            except ValueError:
                raise ApiError(400, f"invalid X-Sandhold-If-End-At {raw!r}") from None
        if_state = request.headers.get("x-sandhold-if-state")
        if if_state is not None and if_state not in ("running", "paused"):
            raise ApiError(400, f"invalid X-Sandhold-If-State {if_state!r}: use running or paused")
        await self.sandboxes.kill(team, request.path_params["id"], if_state, if_end_at)
        return Response(status_code=204)

    async def _connect(self, request: Request, team: str, body: models.ConnectV2) -> Response:
        sbx, resumed = await self.sandboxes.connect(
            team, request.path_params["id"], body.timeout, body.memory
        )
        return JSONResponse(
            sbx.to_sandbox(self.sandboxes.domain), status_code=201 if resumed else 200
        )

    async def connect_v2(self, request: Request, team: str) -> Response:
        body = models.parse(models.ConnectV2, await read_body(request), empty_ok=True)
        return await self._connect(request, team, body)

    async def connect_v1(self, request: Request, team: str) -> Response:
        body = models.parse(models.ConnectV1, await read_body(request))
        return await self._connect(request, team, models.ConnectV2(timeout=body.timeout))

    async def resume(self, request: Request, team: str) -> Response:
        body = models.parse(models.Resume, await read_body(request), empty_ok=True)
        sbx = await self.sandboxes.resume(
            team, request.path_params["id"], body.timeout, body.autoPause, body.memory
        )
        return JSONResponse(sbx.to_sandbox(self.sandboxes.domain), status_code=201)

    async def pause(self, request: Request, team: str) -> Response:
        models.parse(models.Pause, await read_body(request), empty_ok=True)
        await self.sandboxes.pause(team, request.path_params["id"])
        return Response(status_code=204)

    async def set_timeout(self, request: Request, team: str) -> Response:
        body = models.parse(models.SetTimeout, await read_body(request))
        await self.sandboxes.set_timeout(team, request.path_params["id"], body.timeout)
        return Response(status_code=204)

    async def update_network(self, request: Request, team: str) -> Response:
        body = models.parse(models.NetworkUpdate, await read_body(request), empty_ok=True)
        await self.sandboxes.update_network(team, request.path_params["id"], body)
        return Response(status_code=204)

    async def refresh(self, request: Request, team: str) -> Response:
        body = models.parse(models.Refresh, await read_body(request), empty_ok=True)
        await self.sandboxes.refresh(team, request.path_params["id"], body.duration)
        return Response(status_code=204)

    async def metrics(self, request: Request, team: str) -> Response:
        start, end = int_param(request, "start"), int_param(request, "end")
        sbx = self.sandboxes.owned(team, request.path_params["id"])
        await self.sandboxes.sample(sbx)
        return JSONResponse(self.sandboxes.history(sbx.id, start, end))

    async def batch_metrics(self, request: Request, team: str) -> Response:
        ids = [i for i in request.query_params.get("sandbox_ids", "").split(",") if i]
        if not ids:
            raise ApiError(400, "sandbox_ids must list at least one sandbox id")
        if len(ids) > MAX_METRICS_IDS:
            raise ApiError(400, f"sandbox_ids may list at most {MAX_METRICS_IDS} sandboxes")
        out: dict[str, Any] = {}
        for sandbox_id in dict.fromkeys(ids):
            try:
                sbx = self.sandboxes.owned(team, sandbox_id)
                out[sbx.id] = await self.sandboxes.sample(sbx)
            except ApiError:
                continue  # unknown or foreign ids are left out, as E2B does
        return JSONResponse({"sandboxes": out})

    # -- volumes ------------------------------------------------------------------------------
    async def create_volume(self, request: Request, team: str) -> Response:
        body = models.parse(models.NewVolume, await read_body(request))
        vol = self.volumes.create(team, body.name)
        return JSONResponse(vol.public(), status_code=201)

    async def list_volumes(self, request: Request, team: str) -> Response:
        return JSONResponse([v.public(with_token=False) for v in self.volumes.list(team)])

    async def get_volume(self, request: Request, team: str) -> Response:
        return JSONResponse(self.volumes.get(team, request.path_params["id"]).public())

    async def delete_volume(self, request: Request, team: str) -> Response:
        vol = self.volumes.get(team, request.path_params["id"])
        users = [s.id for s in self.sandboxes.all()
                 if any(m.get("name") == vol.name for m in s.st.volume_mounts)]  # fmt: skip
        if users:
            raise ApiError(409, f"volume {vol.name!r} is mounted by sandbox {users[0]}")
        self.volumes.delete(vol)
        return Response(status_code=204)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message)


async def _sandhold_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SandholdError)
    e = from_sandhold(exc)
    return error_response(e.status, e.message)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(404, f"no such endpoint: {request.method} {request.url.path}")
    if exc.status_code == 405:
        return error_response(405, f"method {request.method} is not allowed on {request.url.path}")
    return error_response(exc.status_code, str(exc.detail))


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(500, f"internal error: {type(exc).__name__}")
