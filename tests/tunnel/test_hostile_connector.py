"""Attacks from the connector's side of a tunnel, against a real gateway: the test holds a
tunnel's token and answers the gateway's polls itself (a compromised or buggy connector), so
it can send what no honest connector would — a tool list that tries to break the gateway's MCP
listing, answers to other tunnels' requests, a flood of requests or of connector identities."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandhold.gateway.tool_args import DESCRIPTIONS, MODELS
from tests.support.gateway_server import (
    OTHER_KEY,
    TENANT_KEY,
    Gateway,
    destroy_runtime_dir,
    gateway_env,
    scratch_dir,
    wait_for,
)
from tests.support.tunnel import TUNNEL_SETTINGS, admin, create_tunnel

MAX_PENDING = 4
MAX_POLLS = 3
Answer = Callable[[dict[str, Any]], dict[str, Any] | None]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data_dir = scratch_dir("sandhold-gw-tunh-")
    settings = {**TUNNEL_SETTINGS, "gateway_tunnel_max_pending": MAX_PENDING,
                "gateway_tunnel_max_polls": MAX_POLLS}  # fmt: skip
    env = gateway_env(data_dir, "local", None, f"h{uuid.uuid4().hex[:10]}", **settings)
    g = Gateway(data_dir, env, tmp_path_factory.mktemp("tunh") / "gateway.log")
    g.start()
    yield g
    g.close()
    problems = destroy_runtime_dir(data_dir)
    shutil.rmtree(data_dir, ignore_errors=True)
    assert not problems, problems


def result(rid: Any, value: dict[str, Any]) -> dict[str, Any]:
    return {"resp_json": {"jsonrpc": "2.0", "id": rid, "result": value}, "resp_code": 200}


def mcp_server(tools: list[Any], call: Answer | None = None) -> Answer:
    """A connector's answers: an MCP server with ``tools`` whose ``tools/call`` is ``call``."""

    def answer(cmd: dict[str, Any]) -> dict[str, Any] | None:
        msg = cmd["jsonrpc"]
        if "id" not in msg:
            return {"resp_type": "notify_ack", "resp_code": 202}
        if msg["method"] == "server/discover":  # a handshake-era server: it does not know it
            error = {"code": -32601, "message": "Method not found"}
            return {
                "resp_json": {"jsonrpc": "2.0", "id": msg["id"], "error": error},
                "resp_code": 200,
            }
        if msg["method"] == "initialize":
            info = {"name": "hostile", "version": "1"}
            init = {"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": info}
            return result(msg["id"], init)
        if msg["method"] == "tools/list":
            return result(msg["id"], {"tools": tools})
        return call(cmd) if call else result(msg["id"], {"content": []})

    return answer


class FakeConnector:
    """Polls the gateway with a tunnel's token, answering each command with ``answer``
    (``None``: take the command and never answer it)."""

    def __init__(
        self, gw: Gateway, tunnel: dict[str, Any], answer: Answer, serve: bool = True
    ) -> None:
        self.tunnel, self.answer, self.serve = tunnel, answer, serve
        self.http = httpx.Client(
            base_url=gw.url, timeout=30,
            headers={"Authorization": f"Bearer {tunnel['token']}",
                     "X-Tunnel-Client-Instance-Id": f"fake-{uuid.uuid4().hex[:8]}"},
        )  # fmt: skip
        self.taken: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FakeConnector:
        self.poll(0)  # seen at once: the tunnel is up
        if self.serve:  # (else it answers only what the test polls and answers itself)
            self.thread.start()
        return self

    def serve_until(self, done: Callable[[], bool]) -> None:
        while not done():
            for cmd in self.poll(200):
                body = self.answer(cmd)
                if body is not None:
                    assert self.respond(cmd, body).status_code == 200

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(30)
        self.http.close()

    def poll(self, timeout_ms: int = 500, **params: Any) -> list[dict[str, Any]]:
        r = self.http.get(
            f"/v1/tunnels/{self.tunnel['id']}/poll", params={"timeout_ms": timeout_ms, **params}
        )
        assert r.status_code in (200, 204), r.text
        return list(r.json()["commands"]) if r.status_code == 200 else []

    def respond(self, cmd: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
        return self.http.post(
            f"/v1/tunnels/{self.tunnel['id']}/response",
            json={"request_id": cmd["request_id"], "channel": cmd["channel"], **body},
            headers={"X-Tunnel-Shard-Token": cmd["shard_token"]},
        )

    def _run(self) -> None:
        while not self.done.is_set():
            for cmd in self.poll():
                self.taken.append(cmd)
                body = self.answer(cmd)
                if body is not None:
                    self.respond(cmd, body)


def rest(gw: Gateway, key: str = TENANT_KEY) -> httpx.Client:
    return httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def post(gw: Gateway, path: str, key: str = TENANT_KEY) -> httpx.Response:
    with rest(gw, key) as c:
        return c.post(path, json={})


def in_background(fn: Callable[[], httpx.Response]) -> Callable[[], httpx.Response]:
    """Run ``fn`` in a thread; the returned function waits for its response (``.finished()``
    says whether it has one)."""
    out: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()

    def wait() -> httpx.Response:
        thread.join(60)
        assert out, "the call did not return"
        return out[0]

    wait.finished = lambda: bool(out)  # type: ignore[attr-defined]
    return wait


def rows(gw: Gateway, tunnel_id: str) -> list[tuple[str, str]]:
    """The tunnel's requests in the gateway's store (read-only)."""
    db = sqlite3.connect(f"file:{gw.data_dir}/gateway/gateway.db?mode=ro", uri=True)
    try:
        found = db.execute(
            "SELECT method, state FROM tunnel_requests WHERE tunnel_id=?", (tunnel_id,)
        ).fetchall()
    finally:
        db.close()
    return [(m, s) for m, s in found]


GOOD = {"name": "lookup", "description": "fine", "inputSchema": {"type": "object"}}
HOSTILE_TOOLS: list[Any] = [
    GOOD,
    {"name": "numeric", "description": 42, "inputSchema": {"type": "object"}},
    {"name": "schema", "description": "x", "inputSchema": "not an object"},
    {"name": "annotated", "inputSchema": {"type": "object"}, "annotations": {"title": []}},
    {"name": "essay", "description": "x" * 20_000, "inputSchema": {"type": "object"}},
    {"name": "bad name!", "inputSchema": {"type": "object"}},
    {"name": "run_command", "inputSchema": {"type": "object"}},  # only ever evil__run_command
    "not a tool",
    *({"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(600)),
]


async def test_a_hostile_tool_list_cannot_break_or_flood_the_listing(gw: Gateway) -> None:
    tunnel = create_tunnel(gw, "acme", "evil")

    def call(cmd: dict[str, Any]) -> dict[str, Any]:
        return result(cmd["jsonrpc"]["id"], {"content": "not a list", "isError": "maybe"})

    with FakeConnector(gw, tunnel, mcp_server(HOSTILE_TOOLS, call)):
        headers = {"Authorization": f"Bearer {TENANT_KEY}", "X-Sandhold-Session": "hostile-l"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(f"{gw.url}/mcp", http_client=http)) as c,
        ):
            tools = {t.name: t for t in (await c.list_tools()).tools}
            # the built-in tools are all there, as they are
            assert all(tools[n].description == DESCRIPTIONS[n] for n in MODELS)
            assert tools["evil__lookup"].description == "fine"
            assert "evil__run_command" in tools
            for refused in ("numeric", "schema", "annotated", "essay"):
                assert f"evil__{refused}" not in tools
            assert not any(" " in n or "!" in n for n in tools)
            assert len([n for n in tools if n.startswith("evil__")]) <= 256
            # a tools/call answered with something that is not a CallToolResult: a clear error
            r = await c.call_tool("evil__lookup", {})
            assert r.is_error and json.loads(r.content[0].text)["code"] == "provider_error"
        with rest(gw) as c:
            listed = [t for t in c.get("/v1/tools").json() if t.get("tunnel") == "evil"]
        assert all(isinstance(t["description"], str) for t in listed)
        assert all(len(t["description"]) <= 16384 for t in listed)
    with admin(gw) as a:
        refused = a.get(f"/v1/admin/tunnels/{tunnel['id']}").json()["refused_tools"]
    assert any("numeric" in why for why in refused) and any("more than" in w for w in refused)


def test_requests_in_flight_are_bounded_per_tunnel(gw: Gateway) -> None:
    """A connector that takes every call and answers none cannot make the gateway queue more
    than gateway_tunnel_max_pending of its tunnel's requests: the rest are refused at once."""
    tunnel = create_tunnel(gw, "acme", "hoarder")
    tool = {"name": "hold", "inputSchema": {"type": "object"}}
    held: list[dict[str, Any]] = []
    with FakeConnector(gw, tunnel, mcp_server([tool], lambda cmd: held.append(cmd))) as fc:

        def hold(i: int) -> httpx.Response:
            with rest(gw) as c:
                return c.post(f"/v1/sessions/hoard-{i}/tools/hoarder__hold", json={"i": i})

        with ThreadPoolExecutor(MAX_PENDING) as pool:
            calls = [pool.submit(hold, i) for i in range(MAX_PENDING)]
            wait_for(lambda: len(held) == MAX_PENDING)
            for i in range(3):  # the tunnel is full: refused, nothing queued
                r = hold(100 + i)
                assert r.status_code == 429 and r.json()["code"] == "quota_exceeded", r.text
                assert "gateway_tunnel_max_pending" in r.json()["message"]
            in_store = [s for m, s in rows(gw, tunnel["id"]) if m == "tools/call"]
            assert in_store == ["delivered"] * MAX_PENDING
            for cmd in held:  # answered now: the held calls complete, and room is made
                r = fc.respond(cmd, result(cmd["jsonrpc"]["id"], {"content": []}))
                assert r.status_code == 200, r.text
            assert [c.result().status_code for c in calls] == [200] * MAX_PENDING
        assert rows(gw, tunnel["id"]) == []
        wait_for(lambda: fc.taken)  # (the thread still serves)
        held.clear()
        with ThreadPoolExecutor(1) as pool:
            again = pool.submit(hold, 200)
            wait_for(lambda: held)
            fc.respond(held[0], result(held[0]["jsonrpc"]["id"], {"content": []}))
            assert again.result().status_code == 200


def test_held_polls_are_bounded_per_tunnel(gw: Gateway) -> None:
    """A connector that opens poll after poll cannot make the gateway hold more than
    gateway_tunnel_max_polls of them (each a task reading the store): the rest are refused at
    once, and polling works again when the held ones return."""
    tunnel = create_tunnel(gw, "acme", "poller")
    with FakeConnector(gw, tunnel, mcp_server([]), serve=False) as fc:

        def poll(timeout_ms: int) -> httpx.Response:
            with httpx.Client(base_url=gw.url, headers=fc.http.headers, timeout=30) as c:
                return c.get(f"/v1/tunnels/{tunnel['id']}/poll", params={"timeout_ms": timeout_ms})

        with ThreadPoolExecutor(MAX_POLLS + 1) as pool:  # one more than may be held
            polls = [pool.submit(poll, 4000) for _ in range(MAX_POLLS + 1)]
            answers = [p.result() for p in polls]
        refused = [r for r in answers if r.status_code == 429]
        assert sorted(r.status_code for r in answers) == [204] * MAX_POLLS + [429], answers
        assert refused[0].json()["code"] == "quota_exceeded"
        assert "gateway_tunnel_max_polls" in refused[0].json()["message"]
        assert poll(0).status_code == 204  # room again


TOOL = {"name": "t", "inputSchema": {"type": "object"}}


def test_a_stalled_connector_does_not_hold_up_the_tool_listing(gw: Gateway) -> None:
    """A connector that takes a tools/list and never answers: the tenant's tool listing
    answers without that tunnel's tools (after gateway_tunnel_list_wait_s at most) and shows
    them once the answer comes; later, while a new list is asked for and not answered, the
    last one is served."""
    tunnel = create_tunnel(gw, "acme", "stall")
    lists: list[dict[str, Any]] = []  # the tools/list commands the connector took
    stalled = threading.Event()
    stalled.set()
    honest = mcp_server([TOOL])

    def answer(cmd: dict[str, Any]) -> dict[str, Any] | None:
        if cmd["jsonrpc"].get("method") == "tools/list" and stalled.is_set():
            lists.append(cmd)
            return None
        return honest(cmd)

    def listed(c: httpx.Client) -> set[str]:
        r = c.get("/v1/tools")
        assert r.status_code == 200, r.text
        return {t["name"] for t in r.json()}

    with FakeConnector(gw, tunnel, answer) as fc, rest(gw) as c:
        first = listed(c)
        assert "run_command" in first and "stall__t" not in first
        wait_for(lambda: lists)  # taken, and not answered: the listing did not wait for it
        stalled.clear()
        r = fc.respond(lists[0], result(lists[0]["jsonrpc"]["id"], {"tools": [TOOL]}))
        assert r.status_code == 200, r.text  # the fetch went on after the listing answered
        wait_for(lambda: "stall__t" in listed(c))
        stalled.set()
        during: list[bool] = []

        def asked_again() -> bool:
            during.append("stall__t" in listed(c))
            return len(lists) == 2

        wait_for(asked_again)  # (the listing is kept gateway_tunnel_tools_ttl_s, 1 s here)
        assert during and all(during)
        assert "stall__t" in listed(c)  # the new list is not answered: the last one is served


def test_a_channel_filter_hands_out_only_those_channels(gw: Gateway) -> None:
    """A poll asking only for a channel the connector does not serve gets nothing, not every
    channel's requests."""
    tunnel = create_tunnel(gw, "acme", "picky")
    with FakeConnector(gw, tunnel, mcp_server([TOOL]), serve=False) as fc:
        wait = in_background(lambda: post(gw, "/v1/sessions/picky/tools/picky__t"))
        wait_for(lambda: ("server/discover", "pending") in rows(gw, tunnel["id"]))
        assert fc.poll(300, channel="other") == []
        assert ("server/discover", "pending") in rows(gw, tunnel["id"])  # still there for main
        fc.serve_until(wait.finished)  # type: ignore[attr-defined]
        assert wait().status_code == 200


def test_a_token_cannot_answer_another_tunnels_request(gw: Gateway) -> None:
    """Tunnel A's token, even knowing B's request id and shard token, can neither answer B's
    request (another tenant's) nor fail it with an oversized body."""
    mine = create_tunnel(gw, "acme", "mine")
    theirs = create_tunnel(gw, "globex", "theirs")
    held: list[dict[str, Any]] = []
    with (
        FakeConnector(gw, mine, mcp_server([TOOL]), serve=False) as attacker,
        FakeConnector(gw, theirs, mcp_server([TOOL], held.append)) as victim,
    ):
        wait = in_background(lambda: post(gw, "/v1/sessions/th/tools/theirs__t", OTHER_KEY))
        wait_for(lambda: held)
        cmd = held[0]
        forged = result(cmd["jsonrpc"]["id"], {"content": [{"type": "text", "text": "forged"}]})
        r = attacker.respond(cmd, forged)
        assert r.status_code == 404 and r.json()["error"]["code"] == "pending_request_not_found"
        r = attacker.http.post(
            f"/v1/tunnels/{mine['id']}/response", content=b"x" * 70000,
            headers={"X-Tunnel-Shard-Token": cmd["shard_token"]},
        )  # fmt: skip
        assert r.status_code == 413
        # and through B's own URL, A's token is not B's
        r = attacker.http.post(
            f"/v1/tunnels/{theirs['id']}/response",
            json={"request_id": cmd["request_id"], "resp_code": 200, **forged},
            headers={"X-Tunnel-Shard-Token": cmd["shard_token"]},
        )
        assert r.status_code == 404
        assert rows(gw, theirs["id"]) == [("tools/call", "delivered")]
        real = result(cmd["jsonrpc"]["id"], {"content": [{"type": "text", "text": "real"}]})
        assert victim.respond(cmd, real).status_code == 200
        r = wait()
        assert r.status_code == 200 and r.json()["content"][0]["text"] == "real"


def test_invented_connector_ids_do_not_grow_the_store(gw: Gateway) -> None:
    tunnel = create_tunnel(gw, "acme", "many")
    with FakeConnector(gw, tunnel, mcp_server([]), serve=False) as fc:
        for i in range(80):
            fc.http.headers["X-Tunnel-Client-Instance-Id"] = f"invented-{i}"
            fc.poll(0)
    with admin(gw) as a:
        seen = a.get(f"/v1/admin/tunnels/{tunnel['id']}").json()["connectors"]
    assert 0 < len(seen) <= 32
    assert "invented-79" in {c["instance_id"] for c in seen}  # the newest are the ones kept


def test_a_description_that_is_not_a_string_is_refused(gw: Gateway) -> None:
    with admin(gw) as a:
        for bad in ({"x": 1}, ["a"], 7):
            r = a.post("/v1/admin/tenants/acme/tunnels", json={"name": "typed", "description": bad})
            assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
        names = [t["name"] for t in a.get("/v1/admin/tenants/acme/tunnels").json()["tunnels"]]
    assert "typed" not in names


def test_a_server_of_the_stateless_era_is_spoken_to_in_its_own(gw: Gateway) -> None:
    """A 2026-07-28 server behind a tunnel (it answers ``server/discover`` and refuses
    ``initialize``): the gateway lists and calls its tools without a handshake, every request
    carrying the era's ``_meta`` envelope and its ``Mcp-Protocol-Version``, ``Mcp-Method`` and
    (for a call) ``Mcp-Name`` headers; ``server/discover`` answered through the tunnel decides."""
    tunnel = create_tunnel(gw, "acme", "modern")
    seen: list[dict[str, Any]] = []

    def modern(cmd: dict[str, Any]) -> dict[str, Any] | None:
        msg = cmd["jsonrpc"]
        seen.append(cmd)
        if "id" not in msg:
            return {"resp_type": "notify_ack", "resp_code": 202}
        if msg["method"] == "server/discover":
            found = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}}
            return result(msg["id"], found)
        if msg["method"] == "initialize":  # (not of this era)
            error = {"code": -32601, "message": "Method not found"}
            return {
                "resp_json": {"jsonrpc": "2.0", "id": msg["id"], "error": error},
                "resp_code": 200,
            }
        if msg["method"] == "tools/list":
            return result(msg["id"], {"tools": [TOOL]})
        return result(msg["id"], {"content": [{"type": "text", "text": "modern ok"}]})

    with FakeConnector(gw, tunnel, modern):
        r = post(gw, "/v1/sessions/modern/tools/modern__t")
        assert r.status_code == 200 and "modern ok" in r.text, r.text
    methods = [c["jsonrpc"].get("method") for c in seen]
    assert methods[0] == "server/discover" and "initialize" not in methods, methods
    for cmd in seen:
        msg, headers = cmd["jsonrpc"], {k.lower(): v for k, v in cmd["headers"].items()}
        meta = msg["params"]["_meta"]
        assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
        assert "io.modelcontextprotocol/clientCapabilities" in meta
        assert headers["mcp-protocol-version"] == ["2026-07-28"]
        assert headers["mcp-method"] == [msg["method"]]
        if msg["method"] == "tools/call":
            assert headers["mcp-name"] == ["t"]
