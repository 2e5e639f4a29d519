"""The tools over MCP with the official `mcp` client: streamable HTTP against a gateway process,
and stdio against `sandhold gateway mcp` spawned by the client."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.support.gateway_server import (
    TENANT_KEY,
    Gateway,
    destroy_runtime_dir,
    gateway_env,
    scratch_dir,
)

TOOLS = {"run_code", "run_command", "read_file", "write_file", "list_files", "upload",
         "download", "publish_deliverable", "session_status", "close_session"}  # fmt: skip


def payload(result: object) -> dict:
    assert not result.is_error, result.content  # type: ignore[attr-defined]
    return json.loads(result.content[0].text)  # type: ignore[attr-defined]


def refusal(result: object) -> dict:
    assert result.is_error, result  # type: ignore[attr-defined]
    text = result.content[0].text  # type: ignore[attr-defined]
    # "Error executing tool <name>: {code, message}"
    return json.loads(text[text.index("{") :])


@pytest.mark.parametrize("era", ["2026-07-28", "legacy"])  # stateless, or the handshake
async def test_streamable_http(make_gateway: Callable[..., Gateway], era: str) -> None:
    gw = make_gateway("local")
    headers = {"Authorization": f"Bearer {TENANT_KEY}", "X-Sandhold-Session": "mcp-http"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=120) as http,
        Client(streamable_http_client(f"{gw.url}/mcp", http_client=http), mode=era) as c,
    ):
        assert {t.name for t in (await c.list_tools()).tools} == TOOLS
        r = payload(await c.call_tool("run_command", {"command": "echo $((6*7)) > n.txt"}))
        assert r["exit_code"] == 0
        r = payload(await c.call_tool("read_file", {"path": "n.txt"}))
        assert r["content"] == "42\n"
        # the session comes from the connection, or from an explicit argument
        r = payload(await c.call_tool("run_code", {"code": "print(1+1)",
                                                        "session_id": "mcp-other"}))  # fmt: skip
        assert r["stdout"] == "2\n"
        status = payload(await c.call_tool("session_status", {}))
        assert status["session_id"] == "mcp-http" and status["sandbox"]["state"] == "running"
        # policy is not a tool argument: refused, nothing created
        e = refusal(await c.call_tool("run_command", {"command": "true", "network": "all",
                                                          "session_id": "mcp-new"}))  # fmt: skip
        assert e["code"] == "invalid_argument" and "network" in e["message"]
    with gw.client() as rest:
        assert rest.get("/v1/sessions/mcp-new").status_code == 404
        assert rest.get("/v1/sessions/mcp-other").json()["sandbox"]["state"] == "running"


async def test_stdio(tmp_path: Path) -> None:
    data_dir = scratch_dir("sandhold-gw-stdio-")
    env = gateway_env(data_dir, "local", None, "stdio-test",
                      gateway_workspace_root=data_dir / "workspaces")  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("SANDHOLD_")}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "sandhold.cli", "gateway", "mcp", "--tenant", "acme", "--session", "stdio-1"],
        env={**base, **env},
    )
    try:
        with open(tmp_path / "stdio.log", "w") as errlog:
            async with Client(params) as c:  # type: ignore[call-arg]
                assert {t.name for t in (await c.list_tools()).tools} == TOOLS
                r = payload(await c.call_tool("write_file", {"path": "a.txt", "content": "hi"}))
                assert r["path"] == "/workspace/a.txt"
                r = payload(await c.call_tool("list_files", {}))
                assert [e["name"] for e in r["entries"]] == ["a.txt"]
                e = refusal(await c.call_tool("read_file", {"path": "missing.txt"}))
                assert e["code"] == "invalid_argument"
                r = payload(await c.call_tool("close_session", {}))
                assert r["closed"] and r["sandbox_killed"]
            del errlog
    finally:
        problems = destroy_runtime_dir(data_dir)
    assert not problems, problems


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
