"""The ``mcp`` option of ``Sandbox.create`` through the official SDK (sync and async) and the
official ``mcp`` client: the gateway the SDK starts in the sandbox (``mcp-gateway``) serves the
tools of the servers its template provides (a registry file; a ``github/owner/repo`` entry,
cloned from a repository inside the template through git's ``insteadOf``: nothing leaves this
machine), behind the sandbox's MCP token, at ``get_mcp_url()``'s host (the name resolved to this
loopback server, over plain HTTP: docs/e2b.md); a server it cannot run fails the create the
SDK's way and leaves no sandbox; a malformed option is a 400."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxQuery, Template
from e2b.exceptions import SandboxException
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from sandhold.mcp_gateway.config import check, resolve
from tests.support.e2b_server import KEY_A, Server, new_server

DOMAIN = "sandboxes.sandhold.test"
TEMPLATE = "mcp-tools"
LIB = "/opt/sandhold/mcp-gateway/lib"  # the mcp SDK the template carries (docs/mcp-gateway.md)

ADDER = """
from mcp.server.mcpserver import MCPServer

app = MCPServer("adder")


@app.tool()
def add(a: int, b: int) -> int:
    \"\"\"Add two integers.\"\"\"
    return a + b


app.run()
"""

ECHO = """
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer

app = MCPServer("echo")


@app.tool()
def echo(text: str) -> str:
    \"\"\"Echo the text, with what the install step left and the server's env.\"\"\"
    return f"{text} {Path('installed.txt').read_text().strip()} {os.environ['GREETING']}"


app.run()
"""

# In the template: the registry entries, and a repository `acme/echo-mcp` that git clones
# in place of https://github.com/acme/echo-mcp.
SETUP = """set -e
mkdir -p /etc/mcp-gateway/servers /opt/src/echo /opt/repos/acme
cp /opt/mcp-test/adder.json /etc/mcp-gateway/servers/adder.json
cp /opt/mcp-test/adder.json /etc/mcp-gateway/servers/adder-again.json
cp /opt/mcp-test/echo.py /opt/src/echo/server.py
cd /opt/src/echo && git init -q && git add server.py
git -c user.name=t -c user.email=t@sandbox commit -qm server
git clone -q --bare /opt/src/echo /opt/repos/acme/echo-mcp
git config --system url.file:///opt/repos/.insteadOf https://github.com/
test -x /opt/sandhold/bin/mcp-gateway
"""

ECHO_SERVER = {
    "github/acme/echo-mcp": {
        "install_cmd": "echo installed > installed.txt",
        "run_cmd": "python3 server.py",
        "envs": {"PYTHONPATH": LIB, "GREETING": "hello"},
    }
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("mcp"), public_domain=DOMAIN,
                     template_build_allow_out="[]")  # fmt: skip
    srv.start()
    yield srv
    srv.destroy()


@pytest.fixture(scope="module")
def template(server: Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    ctx = tmp_path_factory.mktemp("mcp-context")
    (ctx / "adder.py").write_text(ADDER)
    (ctx / "echo.py").write_text(ECHO)
    entry = {"command": ["python3", "/opt/mcp-test/adder.py"], "env": {"PYTHONPATH": LIB}}
    (ctx / "adder.json").write_text(json.dumps(entry))
    tpl = (Template(file_context_path=str(ctx)).from_template("mcp-gateway")
           .copy(["adder.py", "echo.py", "adder.json"], "/opt/mcp-test/")
           .run_cmd(SETUP, user="root"))  # fmt: skip
    Template.build(tpl, TEMPLATE, **server.sdk())
    return TEMPLATE


def local_url(server: Server, url: str, host: str) -> str:
    """``get_mcp_url()`` (https://<host>/mcp) as this test reaches it: plain HTTP to the server,
    the host name in the Host header (what wildcard DNS and a TLS terminator would do)."""
    assert url == f"https://{host}/mcp"
    return f"{server.url}/mcp"


async def tools_and_calls(
    url: str, headers: dict[str, str], calls: dict[str, dict[str, Any]], era: str = "auto"
) -> tuple[set[str], dict[str, str]]:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http), mode=era) as c,
    ):
        names = {t.name for t in (await c.list_tools()).tools}
        results = {}
        for name, args in calls.items():
            r = await c.call_tool(name, args)
            assert not r.is_error, r.content
            results[name] = r.content[0].text  # type: ignore[union-attr]
        return names, results


def left_over(server: Server, tag: str) -> list[str]:
    query = SandboxQuery(metadata={"test": tag})
    return [s.sandbox_id for s in Sandbox.list(query=query, **server.sdk()).next_items()]


def test_the_gateway_serves_the_templates_servers(server: Server, template: str) -> None:
    sbx = Sandbox.create(template, mcp={"adder": {}, **ECHO_SERVER},  # type: ignore[dict-item]
                         network={"allow_public_traffic": True}, **server.sdk())  # fmt: skip
    try:
        host = sbx.get_host(50005)
        assert host == f"50005-{sbx.sandbox_id}.{DOMAIN}"
        url = local_url(server, sbx.get_mcp_url(), host)
        token = sbx.get_mcp_token()
        assert token
        # Another client reads it from the sandbox (/etc/mcp-gateway/.token, root's, 0600).
        assert Sandbox.connect(sbx.sandbox_id, **server.sdk()).get_mcp_token() == token
        mode = sbx.commands.run("stat -c '%a %U' /etc/mcp-gateway/.token", user="root")
        assert mode.stdout.strip() == "600 root"
        for era in ("2026-07-28", "legacy"):  # a stateless client, and one of the handshake
            names, results = asyncio.run(tools_and_calls(
                url, {"Host": host, "Authorization": f"Bearer {token}"},
                {"add": {"a": 2, "b": 40}, "echo": {"text": "hi"}}, era,
            ))  # fmt: skip
            assert names == {"add", "echo"}, era
            assert results == {"add": "42", "echo": "hi installed hello"}, era
        for auth in ({"Authorization": "Bearer wrong"}, {}):
            r = httpx.post(url, headers={"Host": host, **auth}, json={})
            assert r.status_code == 401, r.text
            assert r.headers["www-authenticate"] == "Bearer"
    finally:
        sbx.kill()


async def test_async_create_and_the_default_template(server: Server, template: str) -> None:
    sbx = await AsyncSandbox.create(template, mcp={"adder": {}}, **server.sdk())
    try:
        host = sbx.get_host(50005)
        url = local_url(server, sbx.get_mcp_url(), host)
        token = await sbx.get_mcp_token()
        assert token
        # Public traffic off (the server's default): the traffic token too, as for any port.
        r = httpx.post(url, headers={"Host": host, "Authorization": f"Bearer {token}"}, json={})
        assert r.status_code == 403, r.text
        headers = {"Host": host, "Authorization": f"Bearer {token}",
                   "E2B-Traffic-Access-Token": sbx.traffic_access_token or ""}  # fmt: skip
        names, results = await tools_and_calls(url, headers, {"add": {"a": 1, "b": 2}})
        assert names == {"add"} and results == {"add": "3"}
    finally:
        await sbx.kill()
    # No template: the SDK's `mcp-gateway`, here `base` with the command and an empty registry.
    bare = await AsyncSandbox.create(mcp={}, **server.sdk())
    try:
        assert (await bare.get_info()).name == "mcp-gateway"
        host = bare.get_host(50005)
        headers = {"Host": host, "Authorization": f"Bearer {await bare.get_mcp_token()}",
                   "E2B-Traffic-Access-Token": bare.traffic_access_token or ""}  # fmt: skip
        names, _ = await tools_and_calls(local_url(server, bare.get_mcp_url(), host), headers, {})
        assert names == set()
    finally:
        await bare.kill()


def test_a_server_that_cannot_run_fails_the_create(server: Server, template: str) -> None:
    cases: list[tuple[str | None, dict[str, Any], list[str]]] = [
        (None, {"filesystem": {"paths": ["/tmp"]}, "githubOfficial": {}}, [
            "MCP server 'filesystem' is not available in this template",
            "MCP server 'githubOfficial' is not available in this template",
        ]),
        (template, {"adder": {}, "github/acme/missing": {"run_cmd": "true"}}, [
            "MCP server 'github/acme/missing': git clone https://github.com/acme/missing failed",
        ]),
        (template, {"adder": {}, "adder-again": {}}, [
            "tool 'add' is offered by both MCP server 'adder' and 'adder-again'",
        ]),
        (template, {"github/acme/echo-mcp": {"run_cmd": "exit 3"}}, [
            "MCP server 'github/acme/echo-mcp' did not start",
        ]),
    ]  # fmt: skip
    for tpl, mcp, lines in cases:
        tag = uuid.uuid4().hex
        with pytest.raises(SandboxException) as failed:
            Sandbox.create(tpl, mcp=mcp, metadata={"test": tag}, **server.sdk())  # type: ignore[arg-type]
        message = str(failed.value)
        assert message.startswith("Failed to start MCP gateway: "), message
        for line in lines:
            assert line in message, message
        assert left_over(server, tag) == []


async def test_async_failure_leaves_no_sandbox(server: Server) -> None:
    tag = uuid.uuid4().hex
    with pytest.raises(SandboxException, match=r"^Failed to start MCP gateway: .*'notion' is not"):
        await AsyncSandbox.create(mcp={"notion": {}}, metadata={"test": tag}, **server.sdk())  # type: ignore[arg-type]
    assert left_over(server, tag) == []


BAD = [
    ("x", "'mcp'"),
    ([{"filesystem": {}}], "'mcp'"),
    ({"filesystem": 5}, "mcp['filesystem'] must be an object"),
    ({"../etc": {}}, "mcp server name '../etc' is not valid"),
    ({"github/acme": {"run_cmd": "x"}}, "must be github/<owner>/<repo>"),
    ({"github/acme/..": {"run_cmd": "x"}}, "must be github/<owner>/<repo>"),
    ({"github/acme/r": {}}, "run_cmd must be a command"),
    ({"github/acme/r": {"run_cmd": "x", "runCmd": "y"}}, "unknown key 'runCmd'"),
    ({"github/acme/r": {"run_cmd": "x", "envs": {"A": 1}}}, "envs must be an object of strings"),
    ({f"s{i}": {} for i in range(40)}, "at most 32"),
]


@pytest.mark.parametrize(("mcp", "fragment"), BAD)
def test_bad_shapes_are_refused(server: Server, mcp: object, fragment: str) -> None:
    before = {s.sandbox_id for s in Sandbox.list(**server.sdk()).next_items()}
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": KEY_A}) as api:
        r = api.post("/v2/sandboxes", json={"templateID": "mcp-gateway", "mcp": mcp})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["message"], r.json()
    assert {s.sandbox_id for s in Sandbox.list(**server.sdk()).next_items()} == before


def test_base_has_no_gateway(server: Server) -> None:
    base = Sandbox.create("base", **server.sdk())
    try:
        r = base.commands.run("command -v mcp-gateway || echo none")
        assert r.stdout.strip() == "none"
    finally:
        base.kill()
    # (a create with mcp on a template without the command fails as on E2B)
    with pytest.raises(SandboxException, match=r"^Failed to start MCP gateway: .*not found"):
        Sandbox.create("base", mcp={}, **server.sdk())


def test_registry_entries_take_their_config(tmp_path: Path) -> None:
    """(No sandbox: the resolution the command does inside one, over a registry directory.)"""
    entry = {"command": ["srv", "--key=${config.apiKey}"], "env": {"N": "${config.n}"}}
    (tmp_path / "svc.json").write_text(json.dumps(entry))
    (tmp_path / "broken.json").write_text('{"command": "srv"}')
    config = check({"svc": {"apiKey": "k-1", "n": 3}, "broken": {}, "gone": {}})
    specs, errors = resolve(config, registry=tmp_path, work=tmp_path / "work")
    assert [(s.name, s.command, s.env) for s in specs] == [("svc", ["srv", "--key=k-1"], {
        "N": "3", "MCP_SERVER_CONFIG": '{"apiKey": "k-1", "n": 3}'})]  # fmt: skip
    assert errors == [
        f"MCP server 'broken': {tmp_path}/broken.json: command must be a non-empty list of strings",
        f"MCP server 'gone' is not available in this template (no {tmp_path}/gone.json)",
    ]
    _, errors = resolve(check({"svc": {"apiKey": "k"}}), registry=tmp_path)
    assert errors == [f"MCP server 'svc': its config has no 'n' (the template's "
                      f"{tmp_path}/svc.json uses it)"]  # fmt: skip
