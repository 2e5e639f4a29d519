"""tunnel-client's details, in the connector (issue 31), against a stand-in gateway (a real HTTP
server in the test, scripted): ``Retry-After`` on a 429/503 poll and response is honoured; a 404
to a response is terminal, never sent again; a channel the connector does not serve is answered
``unsupported_channel``; ``/readyz`` is ready as soon as the gateway holds the first poll."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandhold.tunnel.connector import Connector
from sandhold.tunnel.connector_config import ConnectorConfig
from tests.thread_server import ThreadServer

TUNNEL = "tunnel_" + "d" * 32
TOKEN_ENV = "SANDHOLD_TEST_TUNNEL_TOKEN"
CLOSED = "http://127.0.0.1:9/mcp"  # (the discard port: nothing listens on loopback)


class StandIn:
    """A gateway whose answers the test scripts: ``polls`` (status, headers, body) in turn, then
    held polls; ``responses`` per request id, in turn, then 200."""

    def __init__(self) -> None:
        self.polls: list[tuple[int, dict[str, str], Any]] = []
        self.hold_s = 0.0
        self.responses: dict[str, list[tuple[int, dict[str, str]]]] = {}
        self.seen: list[tuple[float, str, Any]] = []  # (when, what, body)

    def app(self) -> Starlette:
        async def poll(request: Request) -> Response:
            self.seen.append((time.monotonic(), "poll", None))
            if self.polls:
                status, headers, body = self.polls.pop(0)
                return JSONResponse(body, status_code=status, headers=headers)
            await asyncio.sleep(self.hold_s)
            return Response(status_code=204)

        async def response(request: Request) -> Response:
            body = await request.json()
            self.seen.append((time.monotonic(), "response", body))
            script = self.responses.get(body["request_id"]) or []
            if script:
                status, headers = script.pop(0)
                return JSONResponse({"message": "scripted"}, status_code=status, headers=headers)
            return JSONResponse({"status": "ok"})

        return Starlette(
            routes=[
                Route(f"/v1/tunnels/{TUNNEL}/poll", poll),
                Route(f"/v1/tunnels/{TUNNEL}/response", response, methods=["POST"]),
            ]
        )

    def responses_of(self, rid: str) -> list[tuple[float, Any]]:
        return [
            (at, body)
            for at, what, body in self.seen
            if what == "response" and body["request_id"] == rid
        ]


def command(rid: str, channel: str = "main") -> dict[str, Any]:
    return {
        "request_id": rid,
        "shard_token": f"shard-{rid}",
        "command_type": "jsonrpc",
        "channel": channel,
        "response_timeout": "30s",
        "jsonrpc": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    }


@contextlib.asynccontextmanager
async def connected(stand_in: StandIn, tmp_path: Path) -> AsyncIterator[Connector]:
    with ThreadServer(stand_in.app(), "the stand-in gateway") as gw:
        cfg = ConnectorConfig.model_validate(
            {
                "gateway": {"url": gw.url, "tunnel_id": TUNNEL, "token": f"env:{TOKEN_ENV}",
                            "poll_timeout_ms": 10_000, "backoff_initial_s": 0.05,
                            "backoff_max_s": 5.0},
                "health": {"listen": f"unix:{tmp_path / 'health.sock'}"},
                "upstream": [{"channel": "main", "url": CLOSED}],
            }
        )  # fmt: skip
        conn = Connector(cfg)
        task = asyncio.create_task(conn.run())
        try:
            yield conn
        finally:
            conn.stop.set()
            await asyncio.wait_for(task, 30)


async def until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_retry_after_is_honoured_on_polls_and_responses(tmp_path: Path) -> None:
    s = StandIn()
    s.polls = [
        (503, {"Retry-After": "1"}, {"message": "busy"}),
        (200, {}, {"commands": [command("r1")]}),
    ]
    s.responses["r1"] = [(429, {"Retry-After": "1"})]
    async with connected(s, tmp_path):
        await until(lambda: len(s.responses_of("r1")) == 2, "the response, posted again")
    polls = [at for at, what, _ in s.seen if what == "poll"]
    assert polls[1] - polls[0] >= 0.95  # waited as told, not the 0.05 s backoff
    (first, _), (second, body) = s.responses_of("r1")
    assert second - first >= 0.95
    assert body["request_id"] == "r1"


async def test_a_404_to_a_response_is_terminal(tmp_path: Path) -> None:
    s = StandIn()
    s.polls = [(200, {}, {"commands": [command("r404")]})]
    s.responses["r404"] = [(404, {}), (404, {}), (404, {})]
    s.hold_s = 1.0
    async with connected(s, tmp_path):
        await until(lambda: len(s.responses_of("r404")) >= 1, "the response")
        await asyncio.sleep(1.5)  # (time for a retry, had there been one)
    assert len(s.responses_of("r404")) == 1


async def test_a_channel_it_does_not_serve_is_answered_unsupported_channel(tmp_path: Path) -> None:
    s = StandIn()
    s.polls = [(200, {}, {"commands": [command("rh", channel="harpoon")]})]
    s.hold_s = 1.0
    async with connected(s, tmp_path):
        await until(lambda: len(s.responses_of("rh")) == 1, "the answer")
    (_, body) = s.responses_of("rh")[0]
    assert body["channel"] == "harpoon"
    error = body["resp_json"]["error"]
    assert error["message"].startswith("unsupported_channel")
    assert error["data"]["tunnel_failure"]["transport_error_kind"] == "unsupported_channel"


async def test_ready_as_soon_as_the_first_poll_is_held(tmp_path: Path) -> None:
    s = StandIn()
    s.hold_s = 8.0  # the first poll's answer is 8 s away
    async with connected(s, tmp_path):
        transport = httpx.AsyncHTTPTransport(uds=str(tmp_path / "health.sock"))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as health:

            async def ready() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await health.get("/readyz")).status_code == 200
                return False

            deadline = time.monotonic() + 5
            while not await ready():
                assert time.monotonic() < deadline, "not ready while the poll was held"
                await asyncio.sleep(0.05)
            metrics = (await health.get("/metrics")).text
    assert 'sandhold_tunnel_polls_total{outcome="ok"}' not in metrics  # no poll answered yet
    assert "sandhold_tunnel_connected 1.0" in metrics


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tunnel-token-for-the-stand-in")
