"""Requests relayed through a tunnel, between replicas, by way of the store.

A tool call's replica queues the MCP request (``tunnel_requests``, state ``pending``) and waits
for its answer; the replica a connector long-polls claims it (``delivered``, to that connector's
instance id) and hands it out; the connector posts the answer to any replica, which stores it
(``done``). Each replica wakes its own waiters at once and reads the store every
``gateway_tunnel_relay_interval_s`` for what other replicas did, so one replica or several on
PostgreSQL behave the same.

A request is never handed out twice: a connector that dies holding one (it stops polling) makes
its call fail after ``gateway_tunnel_stale_s``, since the internal server may or may not have run
it (a tools/call need not be idempotent). A poll whose connector has gone (its connection closed)
takes nothing: a request no connector took fails saying it never ran.

Bounds: at most ``gateway_tunnel_max_pending`` requests of a tunnel are queued or held at once
(more are refused), a request waits ``gateway_tunnel_pickup_timeout_s`` for a connector to take
it, and the call's own timeout for the answer; a replica holds at most
``gateway_tunnel_max_polls`` of a tunnel's polls at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Table, delete, func, insert, select, update

from sandhold.config import Settings
from sandhold.errors import NotFound, PayloadTooLarge, QuotaExceeded, Unavailable
from sandhold.isotime import iso
from sandhold.store.db import Store
from sandhold.store.models import TunnelRequest
from sandhold.tunnel.registry import Registry

REQUESTS: Table = TunnelRequest.__table__  # type: ignore[assignment]


class Relay:
    def __init__(self, settings: Settings, store: Store, registry: Registry, replica: str) -> None:
        self.settings = settings
        self.store = store
        self.registry = registry
        self.replica = replica
        self.interval = settings.gateway_tunnel_relay_interval_s
        self._pollers: dict[str, set[asyncio.Event]] = {}  # tunnel id -> polls waiting here
        self._waiters: dict[str, asyncio.Event] = {}  # request id -> the call waiting here

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    # -- the calling side ----------------------------------------------------------------------
    async def request(
        self,
        tunnel_id: str,
        channel: str,
        message: dict[str, Any],
        headers: dict[str, list[str]],
        timeout_s: float,
    ) -> dict[str, Any]:
        """Queue ``message`` (a JSON-RPC request or notification) for the tunnel's connector and
        return the connector's response body (``resp_json``, ``resp_code``, ...)."""
        payload = json.dumps({"jsonrpc": message, "headers": headers}, separators=(",", ":"))
        limit = self.settings.gateway_tunnel_max_request_bytes
        if len(payload) > limit:
            raise PayloadTooLarge(
                f"the MCP request is {len(payload)} bytes, more than this "
                f"gateway sends through a tunnel ({limit}, "
                "gateway_tunnel_max_request_bytes)"
            )
        now = time.time()
        rid = f"treq_{uuid.uuid4().hex}"
        row = {
            "id": rid,
            "tunnel_id": tunnel_id,
            "channel": channel,
            "method": str(message.get("method", ""))[:64],
            "payload": payload,
            "state": "pending",
            "shard_token": uuid.uuid4().hex,
            "created_at": now,
            "expires_at": now + timeout_s,
        }
        event = self._waiters[rid] = asyncio.Event()
        try:
            await self._db(self._enqueue, row)
            for poller in self._pollers.get(tunnel_id, ()):
                poller.set()
            return await self._wait(rid, tunnel_id, now, timeout_s, event)
        finally:
            self._waiters.pop(rid, None)
            with contextlib.suppress(Exception):
                await self._db(self._forget, rid)

    def _enqueue(self, row: dict[str, Any]) -> None:
        limit = self.settings.gateway_tunnel_max_pending
        with self.store.engine.begin() as conn:
            # what a replica that died left behind
            conn.execute(delete(REQUESTS).where(REQUESTS.c.expires_at < row["created_at"] - 600))
            # two replicas counting at once may overshoot by a request each: still bounded
            held = conn.execute(
                select(func.count())
                .select_from(REQUESTS)
                .where(
                    REQUESTS.c.tunnel_id == row["tunnel_id"],
                    REQUESTS.c.state.in_(("pending", "delivered")),
                )
            ).scalar_one()
            if held >= limit:
                raise QuotaExceeded(
                    f"the tunnel has {held} requests in flight, the most it may "
                    f"(gateway_tunnel_max_pending = {limit}); try again when some are answered"
                )
            conn.execute(insert(REQUESTS).values(**row))

    def _forget(self, rid: str) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(delete(REQUESTS).where(REQUESTS.c.id == rid))

    def _read(self, rid: str) -> Any:
        with self.store.engine.connect() as conn:
            return conn.execute(
                select(REQUESTS.c.state, REQUESTS.c.response, REQUESTS.c.delivered_to).where(
                    REQUESTS.c.id == rid
                )
            ).first()

    def _unclaimed_gone(self, rid: str) -> bool:
        """Withdraw a request no connector took; False if one took it in the meantime."""
        with self.store.engine.begin() as conn:
            res = conn.execute(
                delete(REQUESTS).where(REQUESTS.c.id == rid, REQUESTS.c.state == "pending")
            )
            return bool(res.rowcount)

    async def _wait(
        self, rid: str, tunnel_id: str, queued: float, timeout_s: float, event: asyncio.Event
    ) -> dict[str, Any]:
        s = self.settings
        deadline = queued + timeout_s
        while True:
            row = await self._db(self._read, rid)
            now = time.time()
            if row is None:
                raise Unavailable("the tunnel request was withdrawn (its tunnel was deleted?)")
            if row.state == "done":
                return dict(json.loads(row.response))
            if row.state == "failed":
                failure = json.loads(row.response)
                cls = PayloadTooLarge if failure["code"] == "payload_too_large" else Unavailable
                raise cls(failure["message"])
            if row.state == "pending" and now - queued > min(
                s.gateway_tunnel_pickup_timeout_s, timeout_s
            ):
                if await self._db(self._unclaimed_gone, rid):
                    raise Unavailable(
                        f"no connector took the request within "
                        f"{s.gateway_tunnel_pickup_timeout_s:g} s (gateway_tunnel_pickup_timeout_s)"
                        ": it never ran; is `sandhold tunnel connect` running and polling this "
                        "gateway?"
                    )
                continue
            if row.state == "delivered" and row.delivered_to:
                seen = await self._db(self.registry.connector_seen_at, tunnel_id, row.delivered_to)
                if seen is None or now - seen > s.gateway_tunnel_stale_s:
                    ago = "never seen" if seen is None else f"last seen {now - seen:.1f} s ago"
                    raise Unavailable(
                        f"the connector that took the request ({row.delivered_to}) stopped polling "
                        f"({ago}: killed or cut off) before it answered; the internal MCP server "
                        "may or may not have run it, so it is not sent again"
                    )
            if now >= deadline:
                raise Unavailable(f"the tunnel's connector did not answer within {timeout_s:g} s")
            event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(self.interval, max(deadline - now, 0)))

    # -- the connector's side ------------------------------------------------------------------
    def _pending(self, tunnel_id: str, channels: list[str] | None) -> bool:
        q = (
            select(REQUESTS.c.id)
            .where(REQUESTS.c.tunnel_id == tunnel_id, REQUESTS.c.state == "pending")
            .limit(1)
        )
        if channels is not None:  # []: none of them
            q = q.where(REQUESTS.c.channel.in_(channels))
        with self.store.engine.connect() as conn:
            return conn.execute(q).first() is not None

    def _claim(
        self,
        tunnel_id: str,
        instance: str,
        channels: list[str] | None,
        limit: int,
    ) -> list[dict[str, Any]]:
        now = time.time()
        pick = (
            select(REQUESTS.c.id)
            .where(
                REQUESTS.c.tunnel_id == tunnel_id,
                REQUESTS.c.state == "pending",
                REQUESTS.c.expires_at > now,
            )
            .order_by(REQUESTS.c.created_at)
            .limit(limit)
        )
        if channels is not None:
            pick = pick.where(REQUESTS.c.channel.in_(channels))
        with self.store.engine.begin() as conn:  # starts with its write (SQLite: no upgrade)
            rows = conn.execute(
                update(REQUESTS)
                .where(REQUESTS.c.id.in_(pick.scalar_subquery()), REQUESTS.c.state == "pending")
                .values(state="delivered", delivered_to=instance, delivered_at=now)
                .returning(
                    REQUESTS.c.id,
                    REQUESTS.c.channel,
                    REQUESTS.c.payload,
                    REQUESTS.c.shard_token,
                    REQUESTS.c.created_at,
                    REQUESTS.c.expires_at,
                )
            ).all()
        commands = []
        for r in sorted(rows, key=lambda r: r.created_at):
            body = json.loads(r.payload)
            left_ms = max(int((r.expires_at - now) * 1000), 0)
            commands.append(
                {
                    "request_id": r.id,
                    "shard_token": r.shard_token,
                    "command_type": "jsonrpc",
                    "channel": r.channel,
                    "created_at": iso(r.created_at),
                    "response_timeout": f"{left_ms}ms",
                    "headers": body["headers"],
                    "jsonrpc": body["jsonrpc"],
                }
            )
        return commands

    async def poll(
        self,
        tunnel_id: str,
        instance: str,
        channels: list[str] | None,
        limit: int,
        wait_s: float,
        seen: Callable[[], Awaitable[None]],
        disconnected: Callable[[], Awaitable[bool]],
    ) -> list[dict[str, Any]]:
        """The requests for this connector, waiting up to ``wait_s`` for some; ``seen`` records
        that it is alive (at once and every quarter of ``gateway_tunnel_stale_s``)."""
        held, most = len(self._pollers.get(tunnel_id, ())), self.settings.gateway_tunnel_max_polls
        if held >= most:
            raise QuotaExceeded(
                f"the tunnel has {held} polls held on this replica, the most it may hold "
                "(gateway_tunnel_max_polls); poll again when one returns"
            )
        refresh = self.settings.gateway_tunnel_stale_s / 4
        deadline = time.monotonic() + wait_s
        last_seen = time.monotonic()
        event = asyncio.Event()
        self._pollers.setdefault(tunnel_id, set()).add(event)
        try:
            await seen()
            while True:
                event.clear()
                # A connector gone while its poll was held (killed) must not be handed work:
                # the call would never run, and it could not be told so.
                if await self._db(self._pending, tunnel_id, channels) and not await disconnected():
                    claimed = await self._db(self._claim, tunnel_id, instance, channels, limit)
                    if claimed:
                        return claimed
                now = time.monotonic()
                if now >= deadline or await disconnected():
                    return []
                if now - last_seen >= refresh:
                    await seen()
                    last_seen = now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(self.interval, deadline - now))
        finally:
            waiting = self._pollers.get(tunnel_id, set())
            waiting.discard(event)
            if not waiting:
                self._pollers.pop(tunnel_id, None)

    def _answer(self, tunnel_id: str, request_id: str, shard: str, state: str, body: str) -> bool:
        with self.store.engine.begin() as conn:
            res = conn.execute(
                update(REQUESTS)
                .where(
                    REQUESTS.c.id == request_id,
                    REQUESTS.c.tunnel_id == tunnel_id,
                    REQUESTS.c.shard_token == shard,
                    REQUESTS.c.state == "delivered",
                )
                .values(state=state, response=body, responded_at=time.time())
            )
            return bool(res.rowcount)

    def _delivered(self, tunnel_id: str, request_id: str, shard: str) -> bool:
        with self.store.engine.connect() as conn:
            return (
                conn.execute(
                    select(REQUESTS.c.id).where(
                        REQUESTS.c.id == request_id,
                        REQUESTS.c.tunnel_id == tunnel_id,
                        REQUESTS.c.shard_token == shard,
                        REQUESTS.c.state == "delivered",
                    )
                ).first()
                is not None
            )

    def _request_of_shard(self, tunnel_id: str, shard: str) -> str | None:
        with self.store.engine.connect() as conn:
            return conn.execute(
                select(REQUESTS.c.id).where(
                    REQUESTS.c.tunnel_id == tunnel_id, REQUESTS.c.shard_token == shard
                )
            ).scalar()

    async def respond(self, tunnel_id: str, shard: str, body: dict[str, Any]) -> None:
        """Store a connector's response (terminal ones complete the request)."""
        rid = str(body["request_id"])
        if body.get("resp_type", "jsonrpc_response") == "jsonrpc_notify":
            # progress of a request still running: accepted, not relayed (docs/tunnel.md)
            if not await self._db(self._delivered, tunnel_id, rid, shard):
                raise NotFound(_NOT_PENDING)
            return
        raw = json.dumps(body, separators=(",", ":"))
        if not await self._db(self._answer, tunnel_id, rid, shard, "done", raw):
            raise NotFound(_NOT_PENDING)
        if (event := self._waiters.get(rid)) is not None:
            event.set()

    async def refuse_oversized(self, tunnel_id: str, shard: str | None) -> None:
        """A response above the bound: its call fails now (with why) instead of timing out."""
        limit = self.settings.gateway_tunnel_max_response_bytes
        if not shard:
            return
        rid = await self._db(self._request_of_shard, tunnel_id, shard)
        if rid is None:
            return
        failure = json.dumps(
            {
                "code": "payload_too_large",
                "message": (
                    f"the internal MCP server's response is more than {limit} bytes, the most this "
                    "gateway takes from a tunnel (gateway_tunnel_max_response_bytes)"
                ),
            }
        )
        if await self._db(self._answer, tunnel_id, rid, shard, "failed", failure) and (
            event := self._waiters.get(rid)
        ):
            event.set()


_NOT_PENDING = (
    "pending_request_not_found: the request was already answered, timed out, or "
    "was never handed to this tunnel's token"
)
