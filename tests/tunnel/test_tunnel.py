"""The MCP tunnel end to end: an internal MCP server in a network namespace the gateway cannot
reach, its tools offered to one tenant's sessions through `sandhold tunnel connect` running in
that namespace, over the gateway's MCP (official ``mcp`` client) and REST surfaces."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandhold.gateway.tool_args import DESCRIPTIONS
from tests.support.gateway_server import OTHER_KEY, TENANT_KEY, wait_for
from tests.support.tunnel import MCP_PORT, World, admin, create_tunnel, stop


@pytest.fixture(scope="module")
def setup(world: World) -> Iterator[dict[str, Any]]:
    gw = world.gateway()
    tunnel = create_tunnel(gw, "acme", "corp")
    other = create_tunnel(gw, "globex", "corp")  # another tenant's tunnel, same name
    config = world.config(gw, tunnel["id"], tunnel["token"])
    world.connector = world.start_connector(config)
    yield {"gw": gw, "tunnel": tunnel, "other": other, "config": config}
    stop(world.connector)


def rest(gw: Any, key: str = TENANT_KEY) -> httpx.Client:
    return httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def call(
    gw: Any, session: str, tool: str, api_key: str = TENANT_KEY, **args: Any
) -> httpx.Response:
    with rest(gw, api_key) as c:
        return c.post(f"/v1/sessions/{session}/tools/{tool}", json=args)


def text(result: dict[str, Any]) -> str:
    return str(result["content"][0]["text"])


def test_the_gateway_cannot_reach_the_internal_server(world: World) -> None:
    """The server answers inside its namespace, and not from the gateway's."""
    assert world.mcp_answers()
    try:
        r = httpx.post(
            f"http://127.0.0.1:{MCP_PORT}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize"},
            timeout=2,
        )
        assert "corp-internal" not in r.text
    except httpx.TransportError:
        pass  # nothing listens there in this namespace


async def test_tools_listed_and_called_over_mcp(setup: dict[str, Any], world: World) -> None:
    gw = setup["gw"]
    headers = {"Authorization": f"Bearer {TENANT_KEY}", "X-Sandhold-Session": "tun-mcp"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(f"{gw.url}/mcp", http_client=http)) as c,
    ):
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert {"corp__lookup", "corp__slow", "corp__a__echo", "corp__run_command"} <= set(tools)
        # a collision (main's a__b and channel a's b are both corp__a__b) is refused, and the
        # internal run_command is only corp__run_command: the built-in keeps its name
        assert "corp__a__b" not in tools
        assert tools["run_command"].description == DESCRIPTIONS["run_command"]
        r = await c.call_tool("corp__lookup", {"key": "k1"})
        assert not r.is_error and r.content[0].text.startswith("value-of-k1 from net:")
        mcp_ns = r.content[0].text.rsplit(" ", 1)[1]
        r = await c.call_tool("corp__a__echo", {"text": "hi"})  # the stdio upstream
        assert not r.is_error and r.content[0].text == f"stdio echo: hi from {mcp_ns}"
        assert mcp_ns != socket.gethostname() and mcp_ns != _my_netns()
        # both upstreams, HTTP and stdio, spoken to in the stateless era (server/discover
        # answered through the tunnel: no handshake)
        for era in ("corp__era", "corp__a__era"):
            r = await c.call_tool(era, {})
            assert not r.is_error and r.content[0].text == "2026-07-28", r.content
        r = await c.call_tool("corp__broken", {})  # the internal server's own tool error
        assert r.is_error and "broken" in r.content[0].text  # (the SDK hides the why)
    # tenant B sees none of A's tools, and cannot call them
    headers = {"Authorization": f"Bearer {OTHER_KEY}", "X-Sandhold-Session": "tun-b"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(f"{gw.url}/mcp", http_client=http)) as c,
    ):
        names = {t.name for t in (await c.list_tools()).tools}
        assert not any("__" in n for n in names), names  # B's tunnel has no connector
        r = await c.call_tool("corp__lookup", {"key": "k1"})
        assert r.is_error and json.loads(r.content[0].text)["code"] == "unavailable"


def _my_netns() -> str:
    return os.readlink("/proc/self/ns/net")


def test_rest_calls_and_the_timeline(setup: dict[str, Any]) -> None:
    gw = setup["gw"]
    r = call(gw, "tun-rest", "corp__lookup", key="k2")
    assert r.status_code == 200, r.text
    assert text(r.json()).startswith("value-of-k2")
    with rest(gw) as c:
        listed = {t["name"]: t for t in c.get("/v1/tools").json()}
        assert listed["corp__lookup"]["tunnel"] == "corp"
        assert listed["corp__a__echo"]["channel"] == "a"
        events = c.get("/v1/sessions/tun-rest/timeline").json()["events"]
    calls = [e for e in events if e["kind"] == "tunnel_call"]
    assert len(calls) == 1 and calls[0]["tool"] == "corp__lookup"
    assert calls[0]["duration_ms"] > 0 and calls[0]["reason"].endswith("tool lookup: ok")
    assert setup["tunnel"]["token"] not in json.dumps(events)
    assert not any(e["kind"] == "sandbox_created" for e in events)  # no sandbox was needed
    # tenant B: unknown to it (B's own tunnel "corp" is down), and A's session is not B's
    r = call(gw, "tun-rest", "corp__lookup", api_key=OTHER_KEY, key="x")
    assert r.status_code == 503 and r.json()["code"] == "unavailable"
    r = call(gw, "tun-rest", "nosuch__lookup", key="k")
    assert r.status_code == 404
    r = call(gw, "tun-rest", "corp__nosuch")
    assert r.status_code == 404 and "offers no tool" in r.json()["message"]


def test_oversized_requests_and_responses_are_refused(setup: dict[str, Any]) -> None:
    gw = setup["gw"]
    r = call(gw, "tun-big", "corp__lookup", key="k" * 70000)
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large", r.text
    r = call(gw, "tun-big", "corp__big", n=100000)  # above the gateway's 64 KiB response bound
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large", r.text
    assert "gateway_tunnel_max_response_bytes" in r.json()["message"]
    r = call(gw, "tun-big", "corp__big", n=1000)  # and the tunnel still works
    assert r.status_code == 200 and len(text(r.json())) == 1000


def test_tokens_authorize_their_own_tunnel_only(setup: dict[str, Any]) -> None:
    gw, tunnel, other = setup["gw"], setup["tunnel"], setup["other"]
    base = f"/v1/tunnels/{tunnel['id']}"
    for token, status in (
        (other["token"], 404),
        (TENANT_KEY, 401),
        ("sht_forged", 401),
        (None, 401),
    ):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with httpx.Client(base_url=gw.url, headers=headers, timeout=30) as c:
            assert c.get(base).status_code == status
            r = c.get(f"{base}/poll", params={"timeout_ms": 0})
            assert r.status_code == status and r.json()["error"]["message"], r.text
            r = c.post(
                f"{base}/response",
                json={"request_id": "treq_x", "resp_code": 200},
                headers={"X-Tunnel-Shard-Token": "s"},
            )
            assert r.status_code == status
    with httpx.Client(
        base_url=gw.url, timeout=30, headers={"Authorization": f"Bearer {tunnel['token']}"}
    ) as c:
        meta = c.get(base).json()
        assert meta == {"id": tunnel["id"], "name": "corp", "description": "test"}
        # a response for a request this tunnel was never given
        r = c.post(
            f"{base}/response",
            json={"request_id": "treq_x", "resp_code": 200},
            headers={"X-Tunnel-Shard-Token": "s"},
        )
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "pending_request_not_found"
    with admin(gw) as a:
        assert (
            a.post(f"/v1/admin/tunnels/{tunnel['id']}/reveal_token").json()["token"]
            == (tunnel["token"])
        )
        listed = a.get("/v1/admin/tenants/acme/tunnels").json()["tunnels"]
        assert [t["name"] for t in listed] == ["corp"] and listed[0]["connectors"][0]["live"]
        assert "token" not in json.dumps(listed)
        assert a.post("/v1/admin/tenants/acme/tunnels", json={"name": "corp"}).status_code == 409
        assert (
            a.post("/v1/admin/tenants/acme/tunnels", json={"name": "Bad_Name"}).status_code == 400
        )
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {TENANT_KEY}"}) as c:
        assert c.post("/v1/admin/tenants/acme/tunnels", json={"name": "x"}).status_code == 401


def test_killed_connector_fails_the_call_then_a_restarted_one_serves(
    setup: dict[str, Any], world: World
) -> None:
    gw, config = setup["gw"], setup["config"]
    result: dict[str, Any] = {}

    def slow_call() -> None:
        result["r"] = call(gw, "tun-kill", "corp__slow", seconds=30)

    caller = threading.Thread(target=slow_call)
    caller.start()
    wait_for(lambda: _delivered(gw))  # the connector took it: it runs upstream now
    assert world.connector is not None
    stop(world.connector, signal.SIGKILL)
    caller.join(60)
    assert not caller.is_alive()
    r = result["r"]
    assert r.status_code == 503 and "stopped polling" in r.json()["message"], r.text
    # no connector now: the next call fails at once, clearly
    wait_for(lambda: call(gw, "tun-kill", "corp__lookup", key="k").status_code == 503)
    r = call(gw, "tun-kill", "corp__lookup", key="k")
    assert "is down" in r.json()["message"]
    world.connector = world.start_connector(config)
    r = call(gw, "tun-kill", "corp__lookup", key="k3")
    assert r.status_code == 200 and text(r.json()).startswith("value-of-k3"), r.text
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {TENANT_KEY}"}) as c:
        events = c.get("/v1/sessions/tun-kill/timeline").json()["events"]
    outcomes = [e["reason"].rsplit(": ", 1)[1] for e in events if e["kind"] == "tunnel_call"]
    assert outcomes[0] == "error" and outcomes[-1] == "ok"


def test_a_call_for_a_connector_killed_with_its_poll_held_never_ran(
    setup: dict[str, Any], world: World
) -> None:
    """The killed connector's poll is still held on the gateway when the call comes: it must
    not be handed the call (it could never run it), so the call fails saying it never ran."""
    gw, config = setup["gw"], setup["config"]
    assert world.connector is not None
    assert call(gw, "tun-held", "corp__lookup", key="k0").status_code == 200  # (tools listed)
    stop(world.connector, signal.SIGKILL)
    try:
        r = call(gw, "tun-held", "corp__lookup", key="k")  # (within gateway_tunnel_stale_s)
        assert r.status_code == 503, r.text
        message = r.json()["message"]
        assert "never ran" in message or "is down" in message, message
        assert "may or may not" not in message
    finally:
        world.connector = world.start_connector(config)
    r = call(gw, "tun-held", "corp__lookup", key="k4")
    assert r.status_code == 200 and text(r.json()).startswith("value-of-k4"), r.text


def _delivered(gw: Any) -> bool:
    """Whether a tools/call of acme's tunnel has been handed to a connector (read in the
    gateway's store)."""
    with admin(gw) as a:
        tunnels = a.get("/v1/admin/tenants/acme/tunnels").json()["tunnels"]
    db = sqlite3.connect(f"file:{gw.data_dir}/gateway/gateway.db?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT state FROM tunnel_requests WHERE tunnel_id=? AND method='tools/call'",
            (tunnels[0]["id"],),
        ).fetchall()
    finally:
        db.close()
    return ("delivered",) in rows


def test_the_connectors_health_endpoints(setup: dict[str, Any], world: World) -> None:
    with world.health() as h:
        assert h.get("/healthz").json()["status"] == "ok"
        ready = h.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"ready": True, "problems": []}
        metrics = h.get("/metrics").text
    assert 'sandhold_tunnel_polls_total{outcome="ok"}' in metrics
    assert "sandhold_tunnel_connected 1.0" in metrics
