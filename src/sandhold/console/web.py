"""The console's page, its static files and the plumbing of its JSON API, for any server.

The page is one HTML file, its script modules and one stylesheet, all served from here (no CDN, no
inline script or style), with a strict Content-Security-Policy. The API is ``POST
/console/api/<name>`` with a JSON body and ``Authorization: Bearer <key>``: no cookie is ever
set, so a cross-site page cannot borrow a signed-in console (nothing ambient to forge a request
with), and a cross-origin script cannot read an answer (no CORS). Ids go in the body, never in a
URL, so no access log or browser history holds a key or a session id.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold import http_edge
from sandhold.audit import AuditLog
from sandhold.errors import InvalidRequest, SandholdError, Unauthenticated
from sandhold.gateway.errors import rest_status
from sandhold.service.metrics import Sample

if TYPE_CHECKING:
    from sandhold.service import Sandbox, SandboxService

STATIC = Path(__file__).parent / "static"
SCRIPTS = ("console.js", "ui.js", "charts.js", "usage.js", "sandboxes.js", "catalog.js")
FILES = {**{name: "text/javascript" for name in SCRIPTS}, "console.css": "text/css"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
MAX_BODY = 64 * 1024
MIB = 1 << 20


@dataclass(frozen=True)
class Principal:
    """Who signed in: the admin (everything) or one tenant (its own only)."""

    kind: str  # "admin" | "tenant"
    tenant: str | None = None

    def scope(self, asked: str | None) -> str | None:
        """The tenant a query may cover: the tenant's own, or the admin's choice (None: all)."""
        if self.kind == "admin":
            return asked or None
        return self.tenant

    def public(self) -> dict[str, Any]:
        return {"kind": self.kind, "tenant": self.tenant}

    @property
    def actor(self) -> str:
        """Who asked, as the audit log and the timeline name them."""
        return "admin" if self.kind == "admin" else f"tenant {self.tenant}"


Authenticate = Callable[[str], Awaitable[Principal]]
Handler = Callable[[Principal, dict[str, Any]], Awaitable[dict[str, Any]]]


def page_routes(api: str) -> list[Route]:
    """``/console`` and its static files; ``api`` ("gateway", "server", "edge"): the views."""
    index = (STATIC / "index.html").read_text().replace("__API__", api)

    async def page(request: Request) -> Response:
        return Response(index, media_type="text/html; charset=utf-8", headers=HEADERS)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in FILES:
            return Response("not found", status_code=404, headers=HEADERS)
        return Response((STATIC / name).read_bytes(), media_type=FILES[name], headers=HEADERS)

    return [
        Route("/console", page, methods=["GET"]),
        Route("/console/static/{name}", static, methods=["GET"]),
    ]


def api_routes(authenticate: Authenticate, handlers: Mapping[str, Handler]) -> list[Route]:
    """``POST /console/api/<name>`` for each handler, ``whoami`` included."""

    def endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                principal = await authenticate(_bearer(request))
                body = await _body(request)
                return JSONResponse(await handler(principal, body), headers=HEADERS)
            except SandholdError as e:
                return JSONResponse(
                    {"code": e.code, "message": e.message},
                    status_code=rest_status(e),
                    headers=HEADERS,
                )

        return run

    async def whoami(principal: Principal, body: dict[str, Any]) -> dict[str, Any]:
        return principal.public()

    every = {"whoami": whoami, **handlers}
    return [Route(f"/console/api/{n}", endpoint(h), methods=["POST"]) for n, h in every.items()]


def _bearer(request: Request) -> str:
    token = http_edge.bearer(request.headers)
    if token is None:
        raise Unauthenticated("sign in: Authorization: Bearer <key> is missing")
    return token


async def _body(request: Request) -> dict[str, Any]:
    # JSON only: a cross-site form cannot send it without a preflight this server never allows.
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise InvalidRequest("the console API takes application/json")
    return await http_edge.read_json_object(request, MAX_BODY, "the console API's 64 KiB")


def window(body: dict[str, Any], now: float, default_s: float = 86400.0) -> tuple[float, float]:
    """The ``since``/``until`` of a query (epoch seconds), checked."""
    until = _number(body.get("until"), now)
    since = _number(body.get("since"), until - default_s)
    if since > until:
        raise InvalidRequest("since is after until")
    return since, until


def _number(value: object, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest("since and until are epoch seconds")
    return float(value)


def limit(body: dict[str, Any], default: int = 100, most: int = 1000) -> int:
    value = body.get("limit", default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InvalidRequest(f"limit must be an integer from 1 to {most}")
    return value


def text(body: dict[str, Any], name: str, most: int = 256) -> str | None:
    value = body.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > most:
        raise InvalidRequest(f"{name} must be a string of at most {most} characters")
    return value


async def fresh_sample(service: SandboxService, sbx: Sandbox | None) -> Sample | None:
    """A new sample of a running sandbox for a page that shows it now, whatever the sampler's
    interval; None if it is not running (or went meanwhile)."""
    if sbx is None or not sbx.running:
        return None
    try:
        return await service.sample(sbx)
    except SandholdError:
        return None


def usage(s: Sample) -> dict[str, float]:
    """A live sandbox's row fields from one metrics sample."""
    return {
        "cpu_pct": round(s.cpu_used_pct, 1),
        "memory_mib": round(s.mem_used / MIB, 1),
        "disk_mib": round(s.disk_used / MIB, 1),
    }


def point(s: Sample) -> dict[str, float]:
    """One sample of a sandbox's history, as a sandbox page charts it."""
    return {"at": s.at, **usage(s), "memory_total_mib": round(s.mem_total / MIB, 1)}


@contextlib.asynccontextmanager
async def audited(log: AuditLog, record: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """Run an action and write ``record`` (actor, tenant, action, sandbox, session, reason) to
    the console's audit log however it ends: ``done``, ``refused`` (the caller's mistake: not
    found, a conflict) or ``failed`` (ours), with why in ``reason``."""
    record["status"] = "done"
    try:
        yield record
    except Exception as e:
        refused = isinstance(e, SandholdError) and rest_status(e) < 500
        record["status"] = "refused" if refused else "failed"
        why = e.message if isinstance(e, SandholdError) else type(e).__name__
        record["reason"] = f"{record['reason']}: {record['status']}: {why}"
        raise
    finally:
        log.write(record)
