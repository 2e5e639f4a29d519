"""The connector against a compromised gateway: whatever commands the gateway side sends, the
connector relays only to the upstreams of its config, passes no header it was not told to (nor
a header value that would split the request), never sends its token to an upstream, relays at
most ``max_concurrency`` requests at once however many one poll brings, and holds no more of
an answer than its bound. The gateway and the internal servers are stand-ins here (real HTTP
servers on loopback sockets of the test's): a real gateway never sends such commands."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sandhold.tunnel.connector import Connector
from sandhold.tunnel.connector_config import ConnectorConfig, UpstreamConfig
from sandhold.tunnel.upstreams import StdioUpstream, discover_request
from tests.support.tunnel import REPO
from tests.thread_server import ThreadServer

TUNNEL_ID = "tunnel_" + "ab" * 16
TOKEN = f"sht_{uuid.uuid4().hex}"
CONCURRENCY = 2


class Upstream:
    """The configured internal MCP server: records what reaches it and how many at once."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.running = self.most = 0

    async def mcp(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.seen.append({"headers": dict(request.headers), "body": body})
        if body.get("method") == "huge/stream":  # one line that never ends

            async def endless() -> AsyncIterator[bytes]:
                yield b"data: "
                while True:
                    yield b"x" * 65536
                    await asyncio.sleep(0)

            return StreamingResponse(endless(), media_type="text/event-stream")
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.3)  # long enough for the requests relayed at once to overlap
        finally:
            self.running -= 1
        return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"), "result": {"ok": True}})


class HostileGateway:
    """Hands out ``commands`` on the first poll (then nothing) and records the answers."""

    def __init__(self, commands: list[dict[str, Any]]) -> None:
        self.commands = commands
        self.answers: dict[str, dict[str, Any]] = {}

    async def poll(self, request: Request) -> Response:
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        commands, self.commands = self.commands, []
        if not commands:
            await asyncio.sleep(0.2)
            return Response(status_code=204)
        return JSONResponse({"commands": commands})

    async def response(self, request: Request) -> Response:
        body = json.loads(await request.body())
        body["shard"] = request.headers.get("x-tunnel-shard-token")
        self.answers[body["request_id"]] = body
        return JSONResponse({"status": "ok"})


def command(i: str, method: str, channel: str = "main", **extra: Any) -> dict[str, Any]:
    return {
        "request_id": f"treq_{i}", "shard_token": f"shard-{i}", "command_type": "jsonrpc",
        "channel": channel, "response_timeout": "20000ms", "headers": extra.pop("headers", {}),
        "jsonrpc": {"jsonrpc": "2.0", "id": f"id-{i}", "method": method, **extra},
    }  # fmt: skip


@pytest.fixture
def private_host() -> Iterator[tuple[ThreadServer, list[str]]]:
    """Something else in the private network, beyond the configured upstream: nothing the
    gateway sends may reach it."""
    hits: list[str] = []

    async def anything(request: Request) -> Response:
        hits.append(str(request.url))
        return Response("private data")

    routes = [Route("/{path:path}", anything, methods=["GET", "POST", "PUT", "DELETE"])]
    with ThreadServer(Starlette(routes=routes)) as server:
        yield server, hits


async def test_a_compromised_gateway_cannot_steer_the_connector(
    private_host: tuple[ThreadServer, list[str]],
) -> None:
    private, hits = private_host
    upstream = Upstream()
    crafted_headers = {
        "Host": [private.url.removeprefix("http://")],
        "Authorization": ["Bearer stolen"],
        "X-Forwarded-Host": ["elsewhere"],
        "Mcp-Session-Id": ["sid\r\nX-Injected: 1"],
        "Mcp-Protocol-Version": ["\u00e9t\u00e9"],
        "Last-Event-ID": ["7"],
    }
    commands = [
        *(command(f"burst{i}", "tools/call") for i in range(10)),  # more than asked for
        command("steer", "tools/call", headers=crafted_headers,
                params={"url": private.url, "name": "fetch"}),
        command("nochannel", "tools/call", channel="elsewhere"),
        command("huge", "huge/stream"),
    ]  # fmt: skip
    gateway = HostileGateway(commands)
    gw_routes = [
        Route(f"/v1/tunnels/{TUNNEL_ID}/poll", gateway.poll, methods=["GET"]),
        Route(f"/v1/tunnels/{TUNNEL_ID}/response", gateway.response, methods=["POST"]),
    ]
    up_routes = [Route("/mcp", upstream.mcp, methods=["POST"])]
    with (
        ThreadServer(Starlette(routes=gw_routes)) as gw,
        ThreadServer(Starlette(routes=up_routes)) as up,
    ):
        cfg = ConnectorConfig.model_validate({
            "gateway": {"url": gw.url, "tunnel_id": TUNNEL_ID, "token": TOKEN,
                        "poll_timeout_ms": 200, "max_concurrency": CONCURRENCY},
            "health": {"listen": None},
            "upstream": [{"channel": "main", "url": f"{up.url}/mcp"}],
            "limits": {"max_response_bytes": 65536},
        })  # fmt: skip
        connector = Connector(cfg)
        run = asyncio.create_task(connector.run())
        try:
            deadline = time.monotonic() + 60
            while len(gateway.answers) < len(commands):
                assert time.monotonic() < deadline, sorted(gateway.answers)
                assert not run.done(), run
                await asyncio.sleep(0.05)
            ready, problems = connector.ready()
        finally:
            connector.stop.set()
            await asyncio.wait_for(run, 30)
    answers = gateway.answers
    assert all(a["shard"] == a["request_id"].replace("treq_", "shard-") for a in answers.values())
    # every request went to the configured upstream, none anywhere else
    assert hits == []
    assert {s["body"]["id"] for s in upstream.seen} == {
        f"id-{i}" for i in [*(f"burst{n}" for n in range(10)), "steer", "huge"]
    }
    assert upstream.most <= CONCURRENCY  # however many commands one poll brought
    steered = next(s["headers"] for s in upstream.seen if s["body"]["id"] == "id-steer")
    assert steered["host"] == up.url.removeprefix("http://")
    assert "x-injected" not in steered and "x-forwarded-host" not in steered
    assert "authorization" not in steered and TOKEN not in json.dumps(upstream.seen)
    assert "mcp-session-id" not in steered and "mcp-protocol-version" not in steered
    assert steered["last-event-id"] == "7"
    assert answers["treq_steer"]["resp_json"]["result"] == {"ok": True}
    # a crafted header does not make the upstream look unreachable
    assert ready and problems == []
    failure = answers["treq_nochannel"]["resp_json"]["error"]
    assert (
        failure["code"] == -32603
        and "unsupported_channel" in failure["message"]
        and "'elsewhere'" in failure["message"]
    )
    huge = answers["treq_huge"]["resp_json"]["error"]["data"]["tunnel_failure"]
    assert huge["transport_error_kind"] == "response_body_too_large"


async def test_a_timed_out_stdio_request_leaves_nothing_behind() -> None:
    cfg = UpstreamConfig(
        channel="a", command=[sys.executable, "-m", "tests.tunnel.servers", "stdio"],
        env={"PYTHONPATH": str(REPO)}, cwd=str(REPO),
    )  # fmt: skip
    up = StdioUpstream(cfg, 65536, timeout_s=30)
    await up.start()  # (a server of MCP's stateless era: every request carries the envelope)
    up.timeout_s = 0.5  # (the server's start-up took longer than this)
    meta = discover_request(0)[0]["params"]["_meta"]
    try:
        nap = {"name": "nap", "arguments": {"seconds": 1.5}, "_meta": meta}
        call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": nap}
        answer = await up.forward(call, {})
        assert answer["resp_json"]["error"]["data"]["tunnel_failure"]["source"] == "timeout"
        await asyncio.sleep(1.5)  # the late answer arrives, and is dropped
        assert up._waiting == {} and up._answers == {}
        after = {"name": "echo", "arguments": {"text": "after"}, "_meta": meta}
        echo = {"jsonrpc": "2.0", "id": "e", "method": "tools/call", "params": after}
        answer = await up.forward(echo, {})
        assert answer["resp_json"]["id"] == "e"
        assert "stdio echo: after" in json.dumps(answer["resp_json"]["result"])
    finally:
        await up.close()
