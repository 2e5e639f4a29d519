"""The edge (``sandhold edge serve``): one E2B endpoint in front of the fleet's hosts. Stateless:
any number of replicas share the catalog (catalog.py) and each polls the hosts (members.py).

- **Creates** are placed (placement.py): the edge asks the first candidate host to create the
  sandbox under an id the edge chooses, at generation 1; a host that refuses before doing
  anything (503: full, draining; 404: not its template) passes it to the next one. The host's
  answer carries the sandbox's entry, which goes into the catalog before the caller hears.
- **Listing** is the catalog's (team, state, metadata, template, startedAfter, order, pages),
  never a fan-out to hosts.
- **Everything about one sandbox**, control calls and its data plane (``E2b-Sandbox-Id`` or a
  ``{port}-{id}.{domain}`` Host), goes to the host that holds it, with the fleet token and the
  generation the catalog knows (the host fences on it). After a call that may change the
  sandbox, the edge reads it back from the host into the catalog.
- **Anything else** (templates, snapshots, volumes, secrets) goes to one live host.
- **The console** (``/console``, console/edge.py): the hosts and where each sandbox is.

Authentication: the edge checks the API key (the same ``api_keys`` as the hosts') for its own
answers, and passes it on; a host checks it again, and checks the sandboxes' own tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import socket
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
from starlette.routing import Router

from sandhold import http_edge
from sandhold.config import Settings
from sandhold.console import edge as console
from sandhold.e2b.agent_conns import AgentConnections
from sandhold.e2b.auth import Teams
from sandhold.e2b.proxy import (
    HOP_BY_HOP,
    READ_CHUNK,
    exchange,
    gone,
    passed_on,
    route,
    send_json,
)
from sandhold.errors import HostUnavailable, InvalidRequest, SandboxGone, Unauthenticated
from sandhold.fleet import hop, listing
from sandhold.fleet.catalog import Catalog, Row
from sandhold.fleet.hop import CONNECT_TIMEOUT_S
from sandhold.fleet.members import Members
from sandhold.fleet.metrics import EdgeMetrics
from sandhold.fleet.moves import Moves
from sandhold.fleet.placement import order
from sandhold.runtime.records import new_sandbox_id
from sandhold.service.prom import CONTENT_TYPE

log = logging.getLogger(__name__)

Scope = dict[str, Any]
CREATES = frozenset({"/sandboxes", "/v2/sandboxes"})
SANDBOX_PATH = re.compile(r"^/(?:v2/)?sandboxes/([a-z0-9]+)(?:-[a-z0-9]+)?(/[a-z]+)?$")
# Hop-by-hop headers and the fleet's own (never taken from a client).
DROP = HOP_BY_HOP | frozenset(
    {
        b"x-sandhold-fleet-token",
        b"x-sandhold-generation",
        b"x-sandhold-sandbox-id",
    }
)
ROUTE_TTL_S = 1.0
ROUTES_KEPT = 100_000
HOST_TIMEOUT_S = 120.0  # a create that builds its template's warm start can take a minute
READ_TIMEOUT_S = 30.0  # a GET (info, metrics, logs): a host that takes longer is not well
NO_HOST = "no host has room for the sandbox: every host is full, draining or unreachable"


class Edge:
    def __init__(self, settings: Settings) -> None:
        settings.check_fleet_edge()
        self.settings = settings
        url = settings.fleet_catalog_url or f"sqlite:///{settings.data_dir / 'fleet.db'}"
        self.catalog = Catalog(url)
        self.teams = Teams(settings.api_keys)
        self.client = httpx.AsyncClient(timeout=HOST_TIMEOUT_S)
        self.members = Members(settings, self.catalog, self.client)
        self.metrics = EdgeMetrics(self.members)
        self.moves = Moves(settings, self.catalog, self.members, self.client, self.metrics)
        self.hosts = AgentConnections(READ_CHUNK, self._connect)
        self._poller: asyncio.Task[None] | None = None
        # sandbox id -> (when read, its row): the data plane reads the catalog once a second
        # per sandbox, not per request; a move answers the old route 404/409/502 (fencing),
        # which drops it
        self._routes: OrderedDict[str, tuple[float, Row]] = OrderedDict()
        self.console = Router(console.routes(settings, self.teams, self.catalog, self.members))

    # -- ASGI ----------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return None
        try:
            if (target := route(scope)) is not None:
                return await self._data(scope, receive, send, target.sandbox_id)
            if scope["path"] == "/console" or scope["path"].startswith("/console/"):
                return await self.console(scope, receive, send)
            await self._control(scope, receive, send)
        except SandboxGone as e:
            await send_json(
                send, 502, {"sandboxId": e.sandbox_id, "message": e.message, "code": 502}
            )
        except HostUnavailable as e:
            await send_json(send, 503, {"code": 503, "message": e.message})
        except (Unauthenticated, InvalidRequest) as e:
            status = 401 if isinstance(e, Unauthenticated) else 400
            await send_json(send, status, {"code": status, "message": e.message})
        except Exception:
            log.exception("edge: %s %s failed", scope["method"], scope["path"])
            with contextlib.suppress(Exception):  # (unless the answer had started)
                await send_json(send, 500, {"code": 500, "message": "internal error"})

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await asyncio.to_thread(self.catalog.migrate)
                except Exception as e:
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                self._poller = asyncio.create_task(self.members.run())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.members.polled.wait(), 10)
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self._poller is not None:
                    self._poller.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._poller
                self.hosts.close()
                await self.client.aclose()
                await asyncio.to_thread(self.catalog.close)
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- the data plane ------------------------------------------------------------------------
    async def _data(self, scope: Scope, receive: Any, send: Any, sandbox_id: str | None) -> None:
        if sandbox_id is None:  # a signed /files URL: no sandbox named
            return await send_json(
                send,
                400,
                {
                    "code": 400,
                    "message": "through a fleet's edge, signed file URLs need the sandbox in "
                    "the Host ({port}-{id}.{domain})",
                },
            )
        row = await self._where(sandbox_id)
        status = await self._forward(scope, receive, send, row)
        if status in (404, 409, 502):  # gone or moved: read the catalog again next time
            self._routes.pop(sandbox_id, None)

    async def _where(self, sandbox_id: str) -> Row:
        """The sandbox's row, on a host: one its host paused when draining is taken up again
        by its traffic."""
        known = self._routes.get(sandbox_id)
        if known is not None and time.monotonic() - known[0] < ROUTE_TTL_S:
            return known[1]
        row = await asyncio.to_thread(self.catalog.get, sandbox_id)
        if row is None:
            raise gone(sandbox_id)
        if row.host_id is None:
            if not (row.stored and row.listed.get("sandholdResumeOnCall")):
                raise gone(sandbox_id)
            row = await self.moves.adopt(row, resume=True)
        self._routes[sandbox_id] = (time.monotonic(), row)
        if len(self._routes) > ROUTES_KEPT:
            self._routes.popitem(last=False)
        return row

    async def _connect(self, key: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, _, port = key.rpartition(":")
        reader, writer = await asyncio.open_connection(
            host.strip("[]"), int(port), limit=READ_CHUNK
        )
        # A request goes out in several writes: without this, Nagle holds the body back for the
        # host's delayed ACK (40 ms per commands.run, measured: bench/fleet_bench.py).
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    async def _forward(self, scope: Scope, receive: Any, send: Any, row: Row) -> int | None:
        """Stream the request to ``row``'s host and its answer back; the answer's status."""
        assert row.host_id is not None
        key = urlsplit(self.members.reachable(row.host_id)).netloc
        headers = [
            *passed_on(scope, DROP),
            (b"x-sandhold-fleet-token", self.members.token.encode()),
            (b"x-sandhold-generation", str(row.generation).encode()),
        ]
        target = _target(scope)
        try:
            streams = await asyncio.wait_for(self.hosts.checkout(key), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            raise gone(row.sandbox_id) from None
        clean, status = False, None

        async def observed(msg: dict[str, Any]) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            clean = await exchange(
                scope, receive, observed, *streams, headers, target, row.sandbox_id
            )
        finally:
            if clean:
                self.hosts.checkin(key, streams)
            else:
                streams[1].close()
        return status

    # -- the control plane ---------------------------------------------------------------------
    async def _control(self, scope: Scope, receive: Any, send: Any) -> None:
        path, method = scope["path"].rstrip("/") or "/", scope["method"]
        if path == "/health":
            return await send_json(send, 200, {"status": "ok"})
        if path == "/ready":
            ready = bool(self.members.live)
            return await send_json(
                send, 200 if ready else 503, {"status": "ready" if ready else "no host answers"}
            )
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if path == "/metrics":
            return await self._metrics(send, headers)
        team = self.teams.team_of(headers)
        query = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        if path in CREATES and method == "POST":
            return await self._create(scope, receive, send, team)
        if path in CREATES and method == "GET":
            rows = await asyncio.to_thread(self.catalog.listing, team)
            return await listing.answer(send, rows, query, v1=path == "/sandboxes")
        if (m := SANDBOX_PATH.match(path)) and m.group(1) != "metrics":
            row = await asyncio.to_thread(self.catalog.get, m.group(1))
            if row is None or row.team != team or (row.host_id is None and not row.stored):
                return await send_json(
                    send, 404, {"code": 404, "message": f"sandbox {m.group(1)} not found"}
                )
            if row.host_id is None:  # in the store only
                if method == "POST" and m.group(2) in ("/connect", "/resume"):
                    row = await self.moves.adopt(row, resume=False)
                else:
                    return await self._stored(send, row, method, m.group(2))
            assert row.host_id is not None
            # Whole, with a deadline (a host that died since the last poll must not hold the
            # caller); a change is answered once the catalog has it (the caller may list next).
            r = await self._call(scope, await self._body(receive), row)
            if method == "GET":
                return await _relay(send, self._domain(r, row.host_id))
            if m.group(2) == "/fork" and r.status_code < 300:
                for sid in _forks(r):
                    await self._refresh(sid, row.host_id)
            elif m.group(2) == "/snapshots" and r.status_code < 300:
                with contextlib.suppress(ValueError, TypeError, AttributeError):
                    got = r.json()  # its host has it now, before the next poll says so
                    self.members.note(row.host_id, [got["snapshotID"], *got.get("names", [])])
            elif r.status_code < 500:
                await self._refresh(row.sandbox_id, row.host_id)
            return await _relay(send, self._domain(r, row.host_id))
        # templates, snapshots, volumes, secrets: one host answers for all, the first live one
        # (by id) that takes a connection (one that died since the last poll does not)
        for host_id in sorted(self.members.live):
            key = urlsplit(self.members.reachable(host_id)).netloc
            try:
                streams = await asyncio.wait_for(self.hosts.checkout(key), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                continue
            self.hosts.checkin(key, streams)  # (_forward takes it again)
            stand_in = Row("", team, host_id, 0, "running", False, {}, 0.0, 0.0)
            await self._forward(scope, receive, send, stand_in)
            return
        await send_json(send, 503, {"code": 503, "message": NO_HOST})

    async def _metrics(self, send: Any, headers: dict[str, str]) -> None:
        """Any team's key, or the metrics token as a bearer token (as a host's /metrics)."""
        token, given = self.settings.server_metrics_token, http_edge.bearer(headers)
        if not (token and given and hmac.compare_digest(given.encode(), token.encode())):
            self.teams.team_of(headers)
        text = self.metrics.exposition()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", CONTENT_TYPE.encode())],
            }
        )
        await send({"type": "http.response.body", "body": text})

    async def _stored(self, send: Any, row: Row, method: str, op: str | None) -> None:
        """A call for a sandbox in the store only, other than the resumes that take it up."""
        if method == "GET" and op is None:
            return await send_json(send, 200, row.listed)
        if method == "DELETE" and op is None:
            await self.moves.forget(row)
            await send({"type": "http.response.start", "status": 204, "headers": []})
            return await send({"type": "http.response.body", "body": b""})
        message = f"sandbox {row.sandbox_id} is paused" + (" already" if op == "/pause" else "")
        await send_json(send, 409, {"code": 409, "message": message})

    async def _body(self, receive: Any) -> bytes:
        body, more = bytearray(), True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                break
            body += msg.get("body", b"")
            if len(body) > self.settings.server_max_body_bytes:
                raise InvalidRequest("the request body is too large")
            more = msg.get("more_body", False)
        return bytes(body)

    async def _create(self, scope: Scope, receive: Any, send: Any, team: str) -> None:
        body = await self._body(receive)
        try:
            asked = json.loads(body or b"{}")
        except ValueError:
            asked = {}
        # The catalog learns of the sandbox from its host's answer (or, should this edge die
        # first, from the host's next poll): nothing is written before the host has it.
        sandbox_id = new_sandbox_id()
        fleet = {
            "x-sandhold-fleet-token": self.members.token,
            "x-sandhold-sandbox-id": sandbox_id,
            "x-sandhold-generation": "1",
        }
        missing: hop.Answer | None = None
        prefer = self.members.having(str(asked.get("templateID") or "base"))
        candidates = await self.members.candidates()
        for host in order(candidates, self.settings.fleet_choices, prefer):
            self.members.give(host.host_id)
            key = urlsplit(host.address).netloc
            try:
                headers = _headers(scope, key, fleet)
                r = await hop.call(
                    self.hosts, key, "POST", _target(scope), headers, body, HOST_TIMEOUT_S
                )
            except (OSError, TimeoutError) as e:
                log.warning("create on %s failed before an answer: %s", host.host_id, e)
                continue  # (a create it made after all shows up at the next poll)
            if r.status_code == 503:
                self.metrics.refusals.labels(host.host_id).inc()
                continue  # refused before anything was made: the next one
            if r.status_code == 404:  # not this host's template or snapshot (also made nothing)
                missing = missing or r
                continue
            if r.status_code < 300:
                self.metrics.placements.labels(host.host_id).inc()
                await self._record(r, sandbox_id, host.host_id)
            return await _relay(send, self._domain(r, host.host_id))
        if missing is not None:  # no host has what it starts from
            return await _relay(send, missing)
        self.metrics.unplaced.inc()
        await send_json(send, 503, {"code": 503, "message": NO_HOST})

    async def _call(self, scope: Scope, body: bytes, row: Row) -> hop.Answer:
        """The request, whole, to ``row``'s host at the catalog's generation."""
        assert row.host_id is not None
        key = urlsplit(self.members.reachable(row.host_id)).netloc
        fleet = {
            "x-sandhold-fleet-token": self.members.token,
            "x-sandhold-generation": str(row.generation),
        }
        timeout = READ_TIMEOUT_S if scope["method"] == "GET" else HOST_TIMEOUT_S
        headers = _headers(scope, key, fleet)
        try:
            return await hop.call(
                self.hosts, key, scope["method"], _target(scope), headers, body, timeout
            )
        except TimeoutError:
            raise HostUnavailable(
                f"the sandbox's host {row.host_id} did not answer; retry"
            ) from None
        except OSError:
            raise gone(row.sandbox_id) from None

    def _domain(self, r: hop.Answer, host_id: str) -> hop.Answer:
        """A host's answer about its sandboxes with the ``domain`` the SDK is to use: the
        edge's ``public_domain``, or the host's own with ``fleet_direct_domains``."""
        if r.status_code >= 300 or b'"domain"' not in r.content:
            return r
        domain = self.settings.public_domain
        if self.settings.fleet_direct_domains:
            domain = self.members.live.get(host_id, {}).get("domain") or domain
        try:
            body = r.json()
        except ValueError:
            return r
        # one sandbox's answer, or a fork's: [{"sandbox": {...}} | {"error": ...}]
        for got in body if isinstance(body, list) else [{"sandbox": body}]:
            sandbox = got.get("sandbox") if isinstance(got, dict) else None
            if isinstance(sandbox, dict) and "domain" in sandbox:
                sandbox["domain"] = domain
        return hop.Answer(r.status_code, r.headers, json.dumps(body).encode())

    async def _record(self, r: hop.Answer, sandbox_id: str, host_id: str) -> None:
        """A create's sandbox into the catalog, from the entry its host sent with the answer."""
        try:
            got = json.loads(r.headers["x-sandhold-entry"])
        except (KeyError, ValueError):
            return await self._refresh(sandbox_id, host_id)
        await self.members.record(host_id, got, new=True)

    async def _refresh(self, sandbox_id: str, host_id: str) -> None:
        """Read a sandbox back from its host into the catalog (gone: out of it)."""
        address = self.members.address.get(host_id)
        if address is None:
            return
        try:
            r = await self.client.get(
                f"{address}/fleet/sandboxes/{sandbox_id}", headers=self.members.headers
            )
        except httpx.HTTPError as e:
            log.info("could not read %s back from %s: %s", sandbox_id, host_id, e)
            return
        if r.status_code == 404:
            await asyncio.to_thread(self.catalog.forget, sandbox_id, host_id)
        elif r.status_code == 200:
            await self.members.record(host_id, r.json())


def _target(scope: Scope) -> bytes:
    target: bytes = scope.get("raw_path") or scope["path"].encode()
    return target + (b"?" + scope["query_string"] if scope["query_string"] else b"")


def _headers(scope: Scope, key: str, fleet: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """The request's headers for a whole request to the host at ``key`` (hop.call frames the
    body), with the fleet's own."""
    skip = DROP | {b"host", b"content-length", b"transfer-encoding"}
    headers = [(k, v) for k, v in scope["headers"] if k not in skip]
    headers.append((b"host", key.encode()))
    return headers + [(k.encode(), v.encode()) for k, v in fleet.items()]


def _forks(r: hop.Answer) -> list[str]:
    """The ids of the sandboxes a fork answer made (``[{"sandbox": {...}} | {"error": ...}]``)."""
    try:
        return [str(e["sandbox"]["sandboxID"]) for e in r.json() if "sandbox" in e]
    except (ValueError, TypeError, KeyError):
        return []


async def _relay(send: Any, r: hop.Answer) -> None:
    headers = [
        (b"content-type", r.headers.get("content-type", "application/json").encode()),
        (b"content-length", str(len(r.content)).encode()),
    ]
    await send({"type": "http.response.start", "status": r.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": r.content})
