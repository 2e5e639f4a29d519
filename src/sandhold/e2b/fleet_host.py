"""A fleet host's side of the edge's protocol (docs/fleet.md): ``sandhold serve`` with
``fleet_host_id`` set.

Every request passes ``FleetGate`` before it is served:
- ``X-Sandhold-Fleet-Token`` marks a request from an edge; a wrong token is refused.
- ``/fleet/*`` is the edge's alone: ``GET /fleet/info`` (identity, capacity, every sandbox with
  its generation, polled by every edge), ``GET /fleet/sandboxes/{id}``, ``POST
  /fleet/discard/{id}`` (drop a copy the edge has moved on from), ``POST /fleet/adopt/{id}``
  (take up a sandbox at a newer generation: service/fleet_jobs.py) and ``POST /fleet/drain``.
- A create comes from an edge, with the id and generation the edge gave it
  (``X-Sandhold-Sandbox-Id``, ``X-Sandhold-Generation``), and is refused with 503 *before
  anything is made* when the host is full or draining: the edge then tries the next host.
- A request for a sandbox carrying ``X-Sandhold-Generation`` is fenced: an older generation
  than the host's copy is refused (409: the edge has not seen a move), a newer one means this
  copy was left behind by a move and is discarded (the sandbox is not here).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import secrets
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from importlib.metadata import version
from typing import Any
from urllib.parse import parse_qsl

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sandhold.config import Settings
from sandhold.e2b import wire
from sandhold.e2b.errors import e2b_status
from sandhold.e2b.proxy import route, send_json
from sandhold.errors import SandholdError
from sandhold.runtime.checkpoint.snapshots import SnapshotStore
from sandhold.service import Sandbox, SandboxService, migration
from sandhold.service.fleet import Assignment, assigned, generation_of
from sandhold.service.fleet import of as fleet_of
from sandhold.service.fleet_jobs import FleetJobs

TOKEN = b"x-sandhold-fleet-token"
SANDBOX_ID = b"x-sandhold-sandbox-id"
GENERATION = b"x-sandhold-generation"
ENTRY = b"x-sandhold-entry"
CREATES = re.compile(r"^/(?:v2/)?sandboxes/?$|^/sandboxes/[^/]+/fork$")
SANDBOX_PATH = re.compile(r"^/(?:v2/)?sandboxes/([a-z0-9]+)(?:/|$)")
DISCARD = re.compile(r"^/fleet/discard/([a-z0-9]+)$")
ADOPT = re.compile(r"^/fleet/adopt/([a-z0-9]+)$")
FORGET = re.compile(r"^/fleet/forget/([a-z0-9]+)$")
STORED = re.compile(r"^/fleet/stored/([a-z0-9]+)$")
ONE = re.compile(r"^/fleet/sandboxes/([a-z0-9]+)$")

log = logging.getLogger(__name__)

Scope = dict[str, Any]
App = Callable[[Scope, Any, Any], Awaitable[None]]


class FleetGate:
    def __init__(self, service: SandboxService, settings: Settings) -> None:
        assert settings.fleet_host_id and settings.fleet_token is not None
        self.service = service
        self.settings = settings
        self.host_id = settings.fleet_host_id
        self.token = settings.fleet_token.get_secret_value().encode()
        self.boot_id = secrets.token_hex(8)  # a new one per start: the edge sees restarts
        self.jobs = FleetJobs(service, settings)
        self.admitting: set[str] = set()  # creates admitted and not done: their ids
        service.prom.registry.register(_Unstored(self))

    async def __call__(self, scope: Scope, receive: Any, send: Any, app: App) -> None:
        headers = dict(scope["headers"])
        given = headers.get(TOKEN)
        from_edge = given is not None and hmac.compare_digest(given, self.token)
        path, method = scope["path"], scope["method"]
        if given is not None and not from_edge:
            return await _refuse(send, 401, "invalid fleet token")
        if path == "/ready" and self.jobs.draining:  # out of the Service's endpoints
            return await send_json(send, 503, {"status": "draining", "checks": {}})
        if path.startswith("/fleet/"):
            if not from_edge:
                return await _refuse(send, 401, "the fleet API needs the fleet token")
            return await self._fleet(scope, send)
        if method == "POST" and CREATES.match(path) and route(scope) is None:
            if not from_edge:
                return await _refuse(
                    send, 403, "this is a fleet host: create sandboxes through the fleet's edge"
                )
            return await self._admit(scope, receive, send, app, headers)
        sid = _sandbox_of(scope) if from_edge and GENERATION in headers else None
        if sid is not None and not await self._fenced(sid, headers[GENERATION], send):
            return None
        await app(scope, receive, send)

    # -- admission ---------------------------------------------------------------------------
    async def _admit(
        self, scope: Scope, receive: Any, send: Any, app: App, headers: dict[bytes, bytes]
    ) -> None:
        if self.jobs.draining:
            return await _refuse(send, 503, f"host {self.host_id} is draining")
        given = headers[SANDBOX_ID].decode("latin-1") if SANDBOX_ID in headers else None
        try:
            generation = int(headers.get(GENERATION, b"1"))
        except ValueError:
            return await _refuse(send, 400, "invalid X-Sandhold-Generation")
        # Counted before the first await: creates admitted at once see each other.
        ticket = given or secrets.token_hex(8)  # (a fork: no id given)
        self.admitting.add(ticket)
        token = None
        try:
            used = sum(
                1
                for s in await self.service.query()
                if not s.info.suspended and s.id not in self.admitting
            )
            if used + len(self.admitting) > self.settings.fleet_capacity:
                return await _refuse(
                    send, 503, f"host {self.host_id} is full ({self.settings.fleet_capacity})"
                )
            if given is not None:
                token = assigned.set(Assignment(given, generation))
                send = self._with_entry(given, send)
            await app(scope, receive, send)
        finally:
            self.admitting.discard(ticket)
            if token is not None:
                assigned.reset(token)

    def _with_entry(self, sandbox_id: str, send: Any) -> Any:
        """``send`` that adds the new sandbox's entry to a create's answer (X-Sandhold-Entry):
        the edge records it without asking again."""

        async def sending(msg: dict[str, Any]) -> None:
            if msg["type"] == "http.response.start" and msg["status"] == 201:
                at = time.time()
                sbx = self.service.peek(sandbox_id) or await self.service.get(sandbox_id)
                if sbx is not None:
                    entry = json.dumps(self.entry(sbx, at)).encode()
                    msg = {**msg, "headers": [*msg.get("headers", []), (ENTRY, entry)]}
            await send(msg)

        return sending

    # -- fencing -----------------------------------------------------------------------------
    async def _fenced(self, sandbox_id: str, raw: bytes, send: Any) -> bool:
        """Whether a request at generation ``raw`` may reach this host's copy of the sandbox."""
        sbx = self.service.peek(sandbox_id) or await self.service.get(sandbox_id)
        if sbx is None:
            return True  # the handler answers for a sandbox that is not here
        try:
            asked = int(raw)
        except ValueError:
            await _refuse(send, 400, "invalid X-Sandhold-Generation")
            return False
        mine = generation_of(sbx.info.extra)
        if asked == mine:
            return True
        if asked < mine:
            await _refuse(send, 409, f"sandbox {sandbox_id} moved on (generation {mine})")
            return False
        await self.discard(sandbox_id, asked)
        await _refuse(send, 404, f"sandbox {sandbox_id} not found")
        return False

    async def discard(self, sandbox_id: str, newer: int) -> bool:
        """Kill this host's copy of a sandbox if it is older than generation ``newer``."""
        sbx = await self.service.get(sandbox_id)
        if sbx is None or generation_of(sbx.info.extra) >= newer:
            return False
        log.warning(
            "discarding sandbox %s of generation %d: the fleet has generation %d",
            sandbox_id,
            generation_of(sbx.info.extra),
            newer,
        )
        await self.service.kill(sbx.owner, sandbox_id)
        return True

    # -- the edge's API ----------------------------------------------------------------------
    async def _fleet(self, scope: Scope, send: Any) -> None:
        path, method = scope["path"], scope["method"]
        query = dict(parse_qsl(scope["query_string"].decode("latin-1")))
        if path == "/fleet/info" and method == "GET":
            return await send_json(send, 200, await self.info())
        if path == "/fleet/drain" and method == "POST":
            # As SIGTERM does: the server drains, then exits (e2b/server.py).
            signal.raise_signal(signal.SIGTERM)
            return await send_json(send, 202, {"draining": True})
        if (m := ADOPT.match(path)) and method == "POST":
            try:
                generation, old = int(query["generation"]), int(query["from"])
            except (KeyError, ValueError):
                return await _refuse(send, 400, "adopt needs ?generation=N&from=M")
            try:
                adopted = await self.jobs.adopt(m.group(1), generation, old, "resume" in query)
            except SandholdError as e:
                return await _refuse(send, e2b_status(e), e.message)
            return await send_json(send, 200, self.entry(adopted, time.time()))
        if (m := FORGET.match(path)) and method == "POST" and self.jobs.store is not None:
            generation = int(query.get("generation", "0") or 0)
            await self.service.offload.run(
                migration.forget, self.jobs.store, m.group(1), generation
            )
            return await send_json(send, 200, {"forgotten": True})
        if (m := STORED.match(path)) and method == "GET":  # for an edge settling a lost host
            name = migration.object_name(m.group(1), int(query.get("generation", "0") or 0))
            store = self.jobs.store
            there = store is not None and await self.service.offload.run(store.exists, name)
            return await send_json(send, 200, {"stored": bool(there)})
        if (m := ONE.match(path)) and method == "GET":
            at = time.time()  # before the read: what was read is at least this recent
            sbx = await self.service.get(m.group(1))
            if sbx is None:
                return await _refuse(send, 404, f"sandbox {m.group(1)} not found")
            return await send_json(send, 200, self.entry(sbx, at))
        if (m := DISCARD.match(path)) and method == "POST":
            try:
                newer = int(query.get("generation", ""))
            except ValueError:
                return await _refuse(send, 400, "discard needs ?generation=N")
            done = await self.discard(m.group(1), newer)
            return await send_json(send, 200, {"discarded": done})
        await _refuse(send, 404, f"no such fleet route: {method} {path}")

    def entry(self, sbx: Sandbox, at: float) -> dict[str, Any]:
        """What the edge's catalog keeps of a sandbox (no token), and when this host said it
        (the catalog never lets an older word overwrite a newer one)."""
        fleet = fleet_of(sbx.info.extra)
        return {
            "at": at,
            "sandboxID": sbx.id,
            "team": sbx.owner,
            "generation": generation_of(sbx.info.extra),
            "stored": migration.stored_generation(sbx.info) == generation_of(sbx.info.extra),
            "resumeOnCall": bool(fleet.get("resume_on_call")) and not sbx.running,
            "listed": wire.listed(sbx, self.service.disk_total >> 20),
        }

    def _local(self) -> list[str]:
        """Templates and snapshots on this host's disk (by id and name): placement prefers a
        host that has what a create starts from. Not ``base``: every host makes it in well
        under a second, and preferring its first maker piled creates onto one host."""
        runtime = self.service.runtime
        names = {t.name for t in runtime.templates.list() if not t.stub and t.name != "base"}
        for snap in SnapshotStore(runtime).local():
            names |= {snap.id, *snap.names}
        return sorted(names)

    async def info(self) -> dict[str, Any]:
        at = time.time()  # before the listing: a sandbox made after it is not missing from it
        self.jobs.polled_at = at
        sandboxes = await self.service.query()
        return {
            "at": at,
            "hostId": self.host_id,
            "bootId": self.boot_id,
            "version": version("sandhold"),
            "domain": self.settings.public_domain,  # (its sandboxes' straight to it)
            "capacity": self.settings.fleet_capacity,
            "used": sum(1 for s in sandboxes if not s.info.suspended),
            "draining": self.jobs.draining,
            "unstored": self.jobs.unstored(sandboxes),
            "sandboxes": [self.entry(s, at) for s in sandboxes],
            "local": await self.service.offload.run(self._local),
        }


class _Unstored(Collector):
    """The host's ``/metrics``: paused sandboxes whose memory is not in the shared store yet
    (they die with this host)."""

    def __init__(self, gate: FleetGate) -> None:
        self.gate = gate

    def describe(self) -> Iterable[Metric]:
        return []  # computed at scrape (as service/prom.py's)

    def collect(self) -> Iterable[Metric]:
        g = GaugeMetricFamily(
            "sandhold_fleet_unstored_paused",
            "Paused sandboxes of this fleet host not yet in the shared store.",
        )
        runtime = self.gate.service.runtime
        g.add_metric([], sum(1 for i in runtime.list() if self.gate.jobs.due(i, float("inf"))))
        yield g


def _sandbox_of(scope: Scope) -> str | None:
    if (target := route(scope)) is not None:
        return target.sandbox_id
    m = SANDBOX_PATH.match(scope["path"])
    return m.group(1) if m and m.group(1) != "metrics" else None


async def _refuse(send: Any, status: int, message: str) -> None:
    await send_json(send, status, {"code": status, "message": message})
