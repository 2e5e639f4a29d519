"""The control plane: E2B's REST API (v2 and the v1 forms), translated to the sandbox service.

Status codes and bodies follow what the pinned SDK parses (see the wire-protocol reference): a
wrong success code makes the SDK fail with "Body of the request is None", and every error needs
a JSON ``{code, message}`` body.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold import http_edge
from sandhold.config import Settings
from sandhold.console import server as console
from sandhold.e2b import forks, models, sandbox_logs, secrets, snapshots, templates, wire
from sandhold.e2b.auth import Teams
from sandhold.e2b.creates import DEFAULT_TIMEOUT_S, create_request
from sandhold.e2b.errors import answer, error_response
from sandhold.e2b.network import egress_policy
from sandhold.e2b.volumes import VolumeStore
from sandhold.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    SandholdError,
)
from sandhold.service import Sandbox, SandboxService
from sandhold.service.prom import CONTENT_TYPE
from sandhold.service.readiness import ReadinessProbe

MAX_PAGE = 100  # E2B's: the default and the largest `limit` of a list
MAX_METRICS_IDS = 100

Handler = Callable[[Request, str], Awaitable[Response]]


def parse_metadata_filter(raw: str) -> dict[str, str]:
    """Undo the SDK's encoding: it ``quote()``s each key and value, ``urlencode()``s the pairs
    into one string and sends that as one (again encoded) query value."""
    out: dict[str, str] = {}
    for pair in unquote(raw).split("&"):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidRequest(f"invalid metadata filter {pair!r}: expected key=value")
        out[unquote(key)] = unquote(value)
    return out


def encode_token(started: float, sandbox_id: str) -> str:
    """A page's ``nextToken``: the last item's start time and id (a fleet's edge pages so too)."""
    raw = f"{started!r}__{sandbox_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        started, _, sandbox_id = raw.partition("__")
        return float(started), sandbox_id
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise InvalidRequest(f"invalid nextToken {token!r}") from None


def path_id(request: Request) -> str:
    """The sandbox id of a ``/sandboxes/{id}/...`` path (old SDKs append ``-<clientID>``)."""
    return wire.short_id(request.path_params["id"])


class ControlPlane:
    def __init__(
        self, service: SandboxService, settings: Settings, volumes: VolumeStore, teams: Teams
    ) -> None:
        self.service = service
        self.settings = settings
        self.volumes = volumes
        self.teams = teams
        self.readiness = ReadinessProbe(service.runtime, settings, service.offload)

    @property
    def domain(self) -> str | None:
        return self.settings.public_domain

    @property
    def disk_size_mb(self) -> int:
        return self.service.disk_total // (1024 * 1024)

    async def owned(self, team: str, sandbox_id: str) -> Sandbox:
        return await self.service.owned(team, wire.short_id(sandbox_id))

    async def read_body(self, request: Request) -> bytes:
        return await http_edge.read_body(request, self.settings.server_max_body_bytes)

    def authed(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            team = self.teams.team_of(request.headers)
            query = len(request.scope["query_string"])
            if query > self.settings.server_max_query_bytes:
                raise InvalidRequest(
                    f"the query string is {query} bytes, over the limit of "
                    f"{self.settings.server_max_query_bytes} (setting server_max_query_bytes)"
                )
            return await handler(request, team)

        return endpoint

    def app(
        self, lifespan: Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]
    ) -> Starlette:
        a = self.authed
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/ready", self.ready, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
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
            Route("/sandboxes/{id}/fork", a(self.fork), methods=["POST"]),
            Route("/sandboxes/{id}/snapshots", a(self.create_snapshot), methods=["POST"]),
            Route("/snapshots", a(self.list_snapshots), methods=["GET"]),
            *templates.routes(
                self.service.builds,
                a,
                self.settings.template_upload_max_mb << 20,
                self.settings.server_max_body_bytes,
            ),
            Route("/templates/{id:path}", a(self.delete_template), methods=["DELETE"]),
            *secrets.routes(self.settings, a),
            *console.routes(self.service, self.teams),
            Route("/volumes", a(self.create_volume), methods=["POST"]),
            Route("/volumes", a(self.list_volumes), methods=["GET"]),
            Route("/volumes/{id}", a(self.get_volume), methods=["GET"]),
            Route("/volumes/{id}", a(self.delete_volume), methods=["DELETE"]),
            *sandbox_logs.routes(self.service, a, self.owned),
        ]
        return Starlette(
            routes=routes,
            lifespan=lifespan,
            exception_handlers={
                SandholdError: _sandhold_error,
                HTTPException: _http_error,
                Exception: _internal_error,
            },
        )

    # -- sandboxes ----------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        """200 when a create can succeed now, else 503; which checks failed, not why (no key
        is asked: the reasons, with the host's paths, go to the server's log)."""
        got = await self.readiness.check()
        body = {"status": "ready" if got.ready else "not ready", "checks": got.checks}
        return JSONResponse(body, status_code=200 if got.ready else 503)

    async def prometheus(self, request: Request) -> Response:
        """Server-wide metrics without sandbox ids (service/prom.py), so any team's key may read
        them, and so may the metrics-only token (``server_metrics_token``) as a bearer token:
        Prometheus's scrape configs send ``Authorization``, not custom headers."""
        token, given = self.settings.server_metrics_token, http_edge.bearer(request.headers)
        if not (token and given and hmac.compare_digest(given.encode(), token.encode())):
            self.teams.team_of(request.headers)
        text = await self.service.offload.run(self.service.prom.exposition)
        return Response(text, media_type=CONTENT_TYPE)

    async def _create(self, request: Request, team: str, v1: bool) -> Response:
        raw = await self.read_body(request)
        body = models.parse(models.NewSandboxV1 if v1 else models.NewSandbox, raw)
        key = request.headers.get("idempotency-key") or None
        longest = self.settings.server_max_idempotency_key_chars
        if key is not None and len(key) > longest:
            raise InvalidRequest(
                f"Idempotency-Key is {len(key)} characters, over the limit of {longest} "
                "(setting server_max_idempotency_key_chars)"
            )
        sdk = request.headers.get("package_version")
        req = create_request(
            self.settings, self.volumes, team, body, v1=v1, idempotency_key=key, sdk_version=sdk
        )
        sbx = await self.service.create(req)
        return JSONResponse(wire.created(sbx, self.domain), status_code=201)

    async def create_v2(self, request: Request, team: str) -> Response:
        return await self._create(request, team, v1=False)

    async def create_v1(self, request: Request, team: str) -> Response:
        return await self._create(request, team, v1=True)

    async def _filtered(
        self, request: Request, team: str, states: set[str], mine: list[Sandbox] | None = None
    ) -> list[Sandbox]:
        """The team's sandboxes (``mine``: already listed) the request's filters select."""
        q = request.query_params
        metadata = parse_metadata_filter(q["metadata"]) if q.get("metadata") else {}
        started_after: datetime | None = None
        if q.get("startedAfter"):
            try:
                started_after = datetime.fromisoformat(q["startedAfter"])
            except ValueError:
                raise InvalidRequest(f"invalid startedAfter {q['startedAfter']!r}") from None
            if started_after.tzinfo is None:
                started_after = started_after.replace(tzinfo=UTC)
        template = q.get("template")
        out = []
        if mine is None:
            mine = await self.service.query(team, states=states, metadata=metadata)
        for sbx in mine:
            pairs = metadata.items()
            if sbx.state not in states or any(sbx.metadata.get(k) != v for k, v in pairs):
                continue
            # At the precision the wire carries (startedAt is rendered to the microsecond,
            # rounded): a sandbox's own startedAt given back finds it.
            started = datetime.fromtimestamp(sbx.info.created_at, UTC)
            if started_after is not None and started < started_after:
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
                raise InvalidRequest(f"invalid state {sorted(bad)[0]!r}: use running or paused")
        order = q.get("order") or "desc"
        if order not in ("asc", "desc"):
            raise InvalidRequest(f"invalid order {order!r}: use asc or desc")
        limit = models.int_param(request, "limit")
        limit = MAX_PAGE if limit is None else limit
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}")
        # One listing for the page and the running count (two listed every record twice).
        mine = await self.service.query(team, states=("running", "paused"))
        items = sorted(
            await self._filtered(request, team, states, mine),
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
        running = sum(1 for s in mine if s.state == "running")
        headers = {"X-Total-Running": str(running)}
        if len(items) > limit:
            headers["X-Next-Token"] = encode_token(page[-1].info.created_at, page[-1].id)
        size = self.disk_size_mb
        return JSONResponse([wire.listed(s, size) for s in page], headers=headers)

    async def list_v1(self, request: Request, team: str) -> Response:
        items = await self._filtered(request, team, {"running"})
        items.sort(key=lambda s: (s.info.created_at, s.id), reverse=True)
        return JSONResponse([wire.listed(s, self.disk_size_mb) for s in items])

    async def get_info(self, request: Request, team: str) -> Response:
        sbx = await self.owned(team, request.path_params["id"])
        return JSONResponse(wire.detail(sbx, self.disk_size_mb, self.domain))

    async def kill(self, request: Request, team: str) -> Response:
        # Sandhold's conditional kill (see SandboxService.kill); E2B clients send neither header.
        if_end_at = None
        if raw := request.headers.get("x-sandhold-if-end-at"):
            try:
                if_end_at = datetime.fromisoformat(raw).timestamp()
            except ValueError:
                raise InvalidRequest(f"invalid X-Sandhold-If-End-At {raw!r}") from None
        if_state = request.headers.get("x-sandhold-if-state")
        if if_state is not None and if_state not in ("running", "paused"):
            raise InvalidRequest(f"invalid X-Sandhold-If-State {if_state!r}: use running or paused")
        sandbox_id = path_id(request)
        await self.service.kill(team, sandbox_id, if_state=if_state, if_end_at=if_end_at)
        return Response(status_code=204)

    async def _connect(self, request: Request, team: str, body: models.ConnectV2) -> Response:
        timeout = DEFAULT_TIMEOUT_S if body.timeout is None else body.timeout
        sbx, resumed = await self.service.connect(
            team, path_id(request), timeout, memory=body.memory
        )
        return JSONResponse(wire.created(sbx, self.domain), status_code=201 if resumed else 200)

    async def connect_v2(self, request: Request, team: str) -> Response:
        body = models.parse(models.ConnectV2, await self.read_body(request), empty_ok=True)
        return await self._connect(request, team, body)

    async def connect_v1(self, request: Request, team: str) -> Response:
        body = models.parse(models.ConnectV1, await self.read_body(request))
        return await self._connect(request, team, models.ConnectV2(timeout=body.timeout))

    async def resume(self, request: Request, team: str) -> Response:
        body = models.parse(models.Resume, await self.read_body(request), empty_ok=True)
        sbx = await self.service.resume(
            team,
            path_id(request),
            body.timeout,
            auto_pause=body.autoPause,
            memory=body.memory,
        )
        return JSONResponse(wire.created(sbx, self.domain), status_code=201)

    async def pause(self, request: Request, team: str) -> Response:
        body = models.parse(models.Pause, await self.read_body(request), empty_ok=True)
        await self.service.pause(
            team,
            path_id(request),
            memory=body.memory,
            require_healthy=bool(body.requireHealthyGuest),
        )
        return Response(status_code=204)

    async def fork(self, request: Request, team: str) -> Response:
        raw = await self.read_body(request)
        return await forks.answer(self.service, self.domain, team, path_id(request), raw)

    async def create_snapshot(self, request: Request, team: str) -> Response:
        raw = await self.read_body(request)
        return await snapshots.create(self.service, team, path_id(request), raw)

    async def list_snapshots(self, request: Request, team: str) -> Response:
        return await snapshots.listed(self.service, team, dict(request.query_params))

    async def delete_template(self, request: Request, team: str) -> Response:
        """A team's built template (all its builds), else a snapshot (E2B deletes both here)."""
        if await self.service.offload.run(
            self.service.builds.delete, team, request.path_params["id"]
        ):
            return Response(status_code=204)
        return await snapshots.delete(self.service, team, request.path_params["id"])

    async def set_timeout(self, request: Request, team: str) -> Response:
        body = models.parse(models.SetTimeout, await self.read_body(request))
        await self.service.set_timeout(team, path_id(request), body.timeout)
        return Response(status_code=204)

    async def update_network(self, request: Request, team: str) -> Response:
        body = models.parse(models.NetworkUpdate, await self.read_body(request), empty_ok=True)
        await self._update_network(team, path_id(request), body)
        return Response(status_code=204)

    async def _update_network(self, team: str, sandbox_id: str, body: models.NetworkUpdate) -> None:
        """``PUT /sandboxes/{id}/network``: replace the egress rules (fields left out are
        cleared, as in E2B); the sandbox's next connection is judged by the new ones."""
        network = body.model_dump(exclude_none=True, exclude={"allow_internet_access"})
        sbx = await self.owned(team, sandbox_id)
        if not self.settings.egress_e2b_enabled:
            raise InvalidRequest(
                "egress is not enabled on this server: sandboxes have no "
                "network access unless the operator sets "
                "egress_e2b_enabled"
            )
        tenant = sbx.info.spec.network.tenant or team  # as chosen at create
        policy = egress_policy(self.settings, tenant, body.allow_internet_access, network)
        if sbx.info.spec.network.mode == "none":
            raise Conflict(
                f"sandbox {sbx.id!r} was created without egress, so its "
                "network cannot be changed (the operator disabled "
                "egress_e2b_updatable)"
            )
        if policy.mode == "none":
            policy = policy.model_copy(update={"mode": "allowlist"})
        kept = {
            k: v
            for k, v in (sbx.life.surface.get("network") or {}).items()
            if k in ("allowPublicTraffic", "maskRequestHost")
        }
        await self.service.set_network(
            team,
            sbx.id,
            policy,
            allow_internet_access=body.allow_internet_access,
            network={**kept, **network} or None,
        )

    async def refresh(self, request: Request, team: str) -> Response:
        body = models.parse(models.Refresh, await self.read_body(request), empty_ok=True)
        await self.service.refresh(team, path_id(request), body.duration)
        return Response(status_code=204)

    async def metrics(self, request: Request, team: str) -> Response:
        start, end = models.int_param(request, "start"), models.int_param(request, "end")
        sbx = await self.owned(team, request.path_params["id"])
        await self.service.sample(sbx)
        return JSONResponse([wire.metric(s) for s in self.service.history(sbx.id, start, end)])

    async def batch_metrics(self, request: Request, team: str) -> Response:
        ids = [i for i in request.query_params.get("sandbox_ids", "").split(",") if i]
        if not ids:
            raise InvalidRequest("sandbox_ids must list at least one sandbox id")
        if len(ids) > MAX_METRICS_IDS:
            raise InvalidRequest(f"sandbox_ids may list at most {MAX_METRICS_IDS} sandboxes")
        out: dict[str, Any] = {}
        for sandbox_id in dict.fromkeys(ids):
            try:
                sbx = await self.owned(team, sandbox_id)
                out[sbx.id] = wire.metric(await self.service.sample(sbx))
            except NotFound:
                continue  # unknown or foreign ids are left out, as E2B does
        return JSONResponse({"sandboxes": out})

    # -- volumes ------------------------------------------------------------------------------
    async def create_volume(self, request: Request, team: str) -> Response:
        body = models.parse(models.NewVolume, await self.read_body(request))
        vol = self.volumes.create(team, body.name)
        return JSONResponse(vol.public(), status_code=201)

    async def list_volumes(self, request: Request, team: str) -> Response:
        return JSONResponse([v.public(with_token=False) for v in self.volumes.list(team)])

    async def get_volume(self, request: Request, team: str) -> Response:
        return JSONResponse(self.volumes.get(team, request.path_params["id"]).public())

    async def delete_volume(self, request: Request, team: str) -> Response:
        vol = self.volumes.get(team, request.path_params["id"])
        users = [
            s.id
            for s in await self.service.query()
            if any(m.get("name") == vol.name for m in s.life.surface.get("volume_mounts") or [])
        ]
        if users:
            raise Conflict(f"volume {vol.name!r} is mounted by sandbox {users[0]}")
        self.volumes.delete(vol)
        return Response(status_code=204)


async def _sandhold_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SandholdError)
    return answer(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(404, f"no such endpoint: {request.method} {request.url.path}")
    if exc.status_code == 405:
        return error_response(405, f"method {request.method} is not allowed on {request.url.path}")
    return error_response(exc.status_code, str(exc.detail))


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(500, f"internal error: {type(exc).__name__}")
