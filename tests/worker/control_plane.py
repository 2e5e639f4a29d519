"""A local stand-in for a Claude-Managed-Agents control plane: a real HTTP server (Starlette on
uvicorn, on a loopback socket, in a thread of the test process) serving the endpoints a
self-hosted environment's worker calls, in the shapes of the ``anthropic`` SDK's types:

- the work queue: ``GET /v1/environments/{env}/work/poll`` (long-poll, ``block_ms``; an item not
  acked within ``reclaim_older_than_ms`` is handed out again), ``POST .../work/{id}/ack``,
  ``.../heartbeat`` (a lease of ``ttl_s``; ``expected_last_heartbeat`` must echo the last one,
  ``NO_HEARTBEAT`` at first, else 412 with the server's lease state), ``.../stop``;
  ``GET .../work/{id}``. A lease that runs out puts the item back in the queue;
- sessions: ``GET /v1/sessions/{id}``, ``GET/POST /v1/sessions/{id}/events`` (paged) and
  ``GET /v1/sessions/{id}/events/stream`` (server-sent events).

Every call needs the ``managed-agents-2026-04-01`` beta header and a bearer: the environment
key, or (session and per-item calls) the sessions token of the item's ``secret``.

The scripted "brain" is the test: ``create_session`` queues a work item, ``call`` emits an
``agent.tool_use`` (or ``agent.custom_tool_use``) with a ``requires_action`` idle and waits for
the result event, ``end_turn`` ends the turn.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.thread_server import ThreadServer

BETA = "managed-agents-2026-04-01"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def error(status: int, kind: str, message: str, details: dict[str, Any] | None = None) -> Response:
    body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    if details is not None:
        body["error"]["details"] = details
    return JSONResponse(body, status_code=status)


@dataclass
class WorkItem:
    id: str
    environment_id: str
    session_id: str
    sessions_token: str
    created_at: str = field(default_factory=now_iso)
    state: str = "queued"
    acknowledged_at: str | None = None
    last_heartbeat: str | None = None
    lease_until: float = 0.0
    reserved_until: float = 0.0
    holder: str | None = None  # the worker id of the poll that handed it out last
    log: list[tuple[str, str | None]] = field(default_factory=list)  # (what, worker id)

    def public(self, with_secret: bool = False) -> dict[str, Any]:
        secret = None
        if with_secret:
            payload = json.dumps({"sessions_token": self.sessions_token}).encode()
            secret = base64.urlsafe_b64encode(payload).decode().rstrip("=")
        return {
            "type": "work", "id": self.id, "environment_id": self.environment_id,
            "created_at": self.created_at, "state": self.state, "metadata": {},
            "data": {"type": "session", "id": self.session_id}, "secret": secret,
            "acknowledged_at": self.acknowledged_at, "latest_heartbeat_at": self.last_heartbeat,
            "started_at": self.acknowledged_at, "stop_requested_at": None, "stopped_at": None,
        }  # fmt: skip

    def lease_state(self, ttl_s: int) -> dict[str, Any]:
        return {"last_heartbeat": self.last_heartbeat, "lease_extended": False,
                "state": self.state, "ttl_seconds": ttl_s}  # fmt: skip


@dataclass
class Session:
    id: str
    environment_id: str
    custom_tools: list[str]
    created_at: str = field(default_factory=now_iso)
    events: list[dict[str, Any]] = field(default_factory=list)

    def public(self) -> dict[str, Any]:
        tools: list[dict[str, Any]] = [{"type": "agent_toolset_20260401"}]
        tools += [{"type": "custom", "name": n, "description": f"the app's {n}",
                   "input_schema": {"type": "object", "properties": {}}}
                  for n in self.custom_tools]  # fmt: skip
        agent = {"type": "agent", "id": "agent_test", "name": "test agent", "version": 1,
                 "model": {"id": "claude-test"}, "mcp_servers": [], "skills": [],
                 "tools": tools, "execution_identity": {"type": "service_account"}}  # fmt: skip
        return {
            "type": "session", "id": self.id, "agent": agent, "environment_id": self.environment_id,
            "created_at": self.created_at, "updated_at": self.created_at, "metadata": {},
            "outcome_evaluations": [], "resources": [], "stats": {}, "status": "idle",
            "usage": {}, "vault_ids": [],
        }  # fmt: skip


class ControlPlane:
    """The stand-in's state (shared by the server's thread and the test's, under one lock)."""

    def __init__(self, ttl_s: int = 3) -> None:
        self.ttl_s = ttl_s
        self.environment_id = f"env_{uuid.uuid4().hex[:12]}"
        self.environment_key = f"sk-ant-oat01-{secrets.token_urlsafe(24)}"
        self.items: dict[str, WorkItem] = {}
        self.sessions: dict[str, Session] = {}
        self.misreported: dict[str, str] = {}  # session id -> the id its body says (a bug)
        self.lock = threading.Lock()
        self.http = ThreadServer(self.app(), "the control plane")
        self.url = self.http.url

    def __enter__(self) -> ControlPlane:
        self.http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(*exc)

    # -- the brain's side -----------------------------------------------------------------------
    def create_session(self, custom_tools: list[str] | None = None) -> str:
        sid = f"sesn_{uuid.uuid4().hex[:20]}"
        with self.lock:
            self.sessions[sid] = Session(sid, self.environment_id, custom_tools or [])
            self.queue(sid)
        return sid

    def queue(self, session_id: str) -> WorkItem:
        """A new work item for the session (caller holds the lock)."""
        item = WorkItem(f"work_{uuid.uuid4().hex[:16]}", self.environment_id, session_id,
                        sessions_token=f"sst_{secrets.token_urlsafe(24)}")  # fmt: skip
        self.items[item.id] = item
        return item

    def emit(self, session_id: str, event: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            stored = {"id": f"sevt_{uuid.uuid4().hex[:20]}", "processed_at": now_iso(), **event}
            self.sessions[session_id].events.append(stored)
        return stored

    def call(
        self, session_id: str, name: str, timeout: float = 60, custom: bool = False,
        **tool_input: Any,
    ) -> dict[str, Any]:  # fmt: skip
        """Emit a tool use and wait for the worker's result event."""
        tool_use = self.tool_use(session_id, name, custom, **tool_input)
        return self.result(session_id, tool_use, timeout)

    def tool_use(self, session_id: str, name: str, custom: bool = False, **tool_input: Any) -> str:
        kind = "agent.custom_tool_use" if custom else "agent.tool_use"
        extra = {} if custom else {"evaluated_permission": "allow"}
        ev = self.emit(session_id, {"type": kind, "name": name, "input": tool_input, **extra})
        blocked = {"type": "requires_action", "event_ids": [ev["id"]]}
        self.emit(session_id, {"type": "session.status_idle", "stop_reason": blocked})
        return str(ev["id"])

    def result(self, session_id: str, tool_use_id: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for ev in self.events(session_id):
                if tool_use_id in (ev.get("tool_use_id"), ev.get("custom_tool_use_id")):
                    return ev
            time.sleep(0.05)
        raise AssertionError(f"no result for {tool_use_id} within {timeout} s")

    def results_for(self, session_id: str, tool_use_id: str) -> list[dict[str, Any]]:
        ids = ("tool_use_id", "custom_tool_use_id")
        return [ev for ev in self.events(session_id) if tool_use_id in map(ev.get, ids)]

    def end_turn(self, session_id: str) -> None:
        self.emit(session_id, {"type": "session.status_idle", "stop_reason": {"type": "end_turn"}})

    def events(self, session_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.sessions[session_id].events)

    def item_of(self, session_id: str) -> WorkItem:
        with self.lock:
            self.expire()  # leases are judged whenever the state is looked at
            return next(i for i in self.items.values() if i.session_id == session_id)

    # -- the server -----------------------------------------------------------------------------
    def app(self) -> Starlette:
        env = "/v1/environments/{env}/work"
        return Starlette(routes=[
            Route(f"{env}/poll", self.poll, methods=["GET"]),
            Route(f"{env}/{{work}}", self.get_work, methods=["GET"]),
            Route(f"{env}/{{work}}/ack", self.ack, methods=["POST"]),
            Route(f"{env}/{{work}}/heartbeat", self.heartbeat, methods=["POST"]),
            Route(f"{env}/{{work}}/stop", self.stop, methods=["POST"]),
            Route("/v1/sessions/{sid}", self.get_session, methods=["GET"]),
            Route("/v1/sessions/{sid}/events", self.list_events, methods=["GET"]),
            Route("/v1/sessions/{sid}/events", self.send_events, methods=["POST"]),
            Route("/v1/sessions/{sid}/events/stream", self.stream, methods=["GET"]),
        ])  # fmt: skip

    def refused(self, request: Request, session_id: str | None = None) -> Response | None:
        """The beta header and the bearer: the environment key, or an item's sessions token
        (for its own session and work item)."""
        if BETA not in request.headers.get("anthropic-beta", ""):
            return error(400, "invalid_request_error", f"this endpoint needs the {BETA} beta")
        if "env" in request.path_params and request.path_params["env"] != self.environment_id:
            return error(404, "not_found_error", "no such environment")
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if secrets.compare_digest(token, self.environment_key):
            return None
        work = request.path_params.get("work")
        with self.lock:
            for item in self.items.values():
                if secrets.compare_digest(token, item.sessions_token) and (
                    item.session_id == session_id or item.id == work
                ):
                    return None
        return error(401, "authentication_error", "invalid bearer")

    def expire(self) -> None:
        """Leases that ran out put their item back in the queue (caller holds the lock)."""
        now = time.monotonic()
        for item in self.items.values():
            if item.state in ("starting", "active") and item.lease_until < now:
                item.state, item.last_heartbeat, item.acknowledged_at = "queued", None, None
                item.reserved_until = 0.0
                item.log.append(("requeued", item.holder))

    async def poll(self, request: Request) -> Response:
        if (refusal := self.refused(request)) is not None:
            return refusal
        worker = request.headers.get("anthropic-worker-id")
        block_s = int(request.query_params.get("block_ms") or 0) / 1000
        reclaim_s = int(request.query_params.get("reclaim_older_than_ms") or 5000) / 1000
        deadline = time.monotonic() + block_s
        while True:
            with self.lock:
                self.expire()
                now = time.monotonic()
                for item in self.items.values():
                    if item.state == "queued" and item.reserved_until < now:
                        item.reserved_until, item.holder = now + reclaim_s, worker
                        item.log.append(("polled", worker))
                        return JSONResponse(item.public(with_secret=True))
            if time.monotonic() >= deadline:
                return JSONResponse(None)
            await asyncio.sleep(0.02)

    def work(self, request: Request) -> WorkItem | Response:
        if (refusal := self.refused(request)) is not None:
            return refusal
        item = self.items.get(request.path_params["work"])
        return item if item is not None else error(404, "not_found_error", "no such work item")

    async def get_work(self, request: Request) -> Response:
        item = self.work(request)
        return item if isinstance(item, Response) else JSONResponse(item.public())

    async def ack(self, request: Request) -> Response:
        item = self.work(request)
        if isinstance(item, Response):
            return item
        with self.lock:
            if item.state != "queued":
                return error(409, "invalid_request_error", f"work item is {item.state}")
            item.state, item.acknowledged_at = "starting", now_iso()
            item.lease_until = time.monotonic() + self.ttl_s
            item.log.append(("acked", item.holder))
            return JSONResponse(item.public())

    async def heartbeat(self, request: Request) -> Response:
        item = self.work(request)
        if isinstance(item, Response):
            return item
        expected = request.query_params.get("expected_last_heartbeat")
        with self.lock:
            self.expire()
            if item.state in ("stopping", "stopped"):
                return JSONResponse({"type": "work_heartbeat", "last_heartbeat": item.last_heartbeat
                                     or "", "lease_extended": False, "state": item.state,
                                     "ttl_seconds": self.ttl_s})  # fmt: skip
            stored = item.last_heartbeat or "NO_HEARTBEAT"
            if item.state == "queued" or expected != stored:
                item.log.append(("heartbeat_refused", expected))
                return error(412, "precondition_failed_error", "heartbeat precondition failed",
                             {"error_code": "heartbeat_precondition_failed",
                              "current_state": item.lease_state(self.ttl_s)})  # fmt: skip
            item.state, item.last_heartbeat = "active", now_iso()
            item.lease_until = time.monotonic() + self.ttl_s
            return JSONResponse({"type": "work_heartbeat", "last_heartbeat": item.last_heartbeat,
                                 "lease_extended": True, "state": "active",
                                 "ttl_seconds": self.ttl_s})  # fmt: skip

    async def stop(self, request: Request) -> Response:
        item = self.work(request)
        if isinstance(item, Response):
            return item
        body = json.loads(await request.body() or b"{}")
        with self.lock:
            if item.state == "stopped":
                return error(409, "invalid_request_error", "work item already stopped")
            item.state = "stopped"
            item.log.append(("stopped" if body.get("force") else "stopped_gracefully", item.holder))
            return JSONResponse(item.public())

    def session(self, request: Request) -> Session | Response:
        sid = request.path_params["sid"]
        if (refusal := self.refused(request, sid)) is not None:
            return refusal
        session = self.sessions.get(sid)
        return session if session is not None else error(404, "not_found_error", "no session")

    async def get_session(self, request: Request) -> Response:
        s = self.session(request)
        if isinstance(s, Response):
            return s
        return JSONResponse({**s.public(), "id": self.misreported.get(s.id, s.id)})

    async def list_events(self, request: Request) -> Response:
        s = self.session(request)
        if isinstance(s, Response):
            return s
        limit = int(request.query_params.get("limit") or 100)
        start = int(request.query_params.get("page") or 0)
        with self.lock:
            page = s.events[start : start + limit]
            more = start + limit < len(s.events)
        return JSONResponse({"data": page, "next_page": str(start + limit) if more else None})

    async def send_events(self, request: Request) -> Response:
        s = self.session(request)
        if isinstance(s, Response):
            return s
        sent = [self.emit(s.id, ev) for ev in json.loads(await request.body())["events"]]
        return JSONResponse({"data": sent})

    async def stream(self, request: Request) -> Response:
        s = self.session(request)
        if isinstance(s, Response):
            return s

        async def events() -> AsyncIterator[bytes]:
            with self.lock:
                sent = len(s.events)  # the stream carries what comes after it opened
            last_ping = time.monotonic()
            while True:
                with self.lock:
                    new = s.events[sent:]
                sent += len(new)
                for ev in new:
                    yield f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()
                if time.monotonic() - last_ping > 1:
                    last_ping = time.monotonic()
                    yield b"event: ping\ndata: {}\n\n"
                await asyncio.sleep(0.02)

        return StreamingResponse(events(), media_type="text/event-stream")
