"""`sandhold tunnel doctor` explains each way a connection fails; and a tunnel spans replicas:
the connector polls one gateway, the tool call reaches another, PostgreSQL carries the request
between them."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.gateway.postgres import Postgres
from tests.support.gateway_server import TENANT_KEY
from tests.support.tunnel import MCP_PORT, REPO, World, create_tunnel, stop


def doctor(world: World, config: Path, in_ns: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "sandhold.cli", "tunnel", "doctor", "--config", str(config)]
    if in_ns:
        argv = ["ip", "netns", "exec", world.ns, *argv]
    return subprocess.run(argv, capture_output=True, text=True, env={**world.env, "COLUMNS":
                          "400"}, cwd=REPO, timeout=120)  # fmt: skip


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_doctor_explains_each_failure(world: World) -> None:
    gw = world.gateway()
    tunnel = create_tunnel(gw, "acme", "corp")
    good = world.config(gw, tunnel["id"], tunnel["token"], name="doc-good")
    r = doctor(world, good, in_ns=True)  # from the private network: everything answers
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tunnel 'corp' accepts this token" in r.stdout and "upstream a: " in r.stdout

    bad_token = world.config(gw, tunnel["id"], "sht_not-the-token", name="doc-token")
    r = doctor(world, bad_token, in_ns=True)
    assert r.returncode == 1 and "401: the gateway refused the token" in r.stderr

    unknown = world.config(gw, "tunnel_" + "0" * 32, tunnel["token"], name="doc-unknown")
    r = doctor(world, unknown, in_ns=True)
    assert r.returncode == 1 and "404: the gateway has no tunnel tunnel_000" in r.stderr

    no_way_out = world.config(gw, tunnel["id"], tunnel["token"], name="doc-socket",
                              unix_socket=str(world.dir / "nothing.sock"))  # fmt: skip
    r = doctor(world, no_way_out, in_ns=True)
    assert r.returncode == 1 and "cannot connect to the unix socket" in r.stderr

    # from the gateway's own namespace, the internal server is not there
    port = closed_port()
    text = good.read_text().replace(f"127.0.0.1:{MCP_PORT}/mcp", f"127.0.0.1:{port}/mcp")
    elsewhere = world.dir / "doc-elsewhere.toml"
    elsewhere.write_text(text)
    r = doctor(world, elsewhere)
    assert r.returncode == 1
    assert f"upstream main: the internal MCP server at http://127.0.0.1:{port}/mcp is " \
           "unreachable" in r.stderr  # fmt: skip

    plain = world.dir / "doc-plain.toml"
    plain.write_text(good.read_text().replace(f'unix_socket = "{world.relay(gw)}"\n', "")
                     .replace("http://127.0.0.1", "http://gateway.example.test"))  # fmt: skip
    r = doctor(world, plain)
    assert r.returncode != 0 and "would cross the network in the clear" in r.stderr


def test_a_tunnel_spans_replicas_on_postgresql(world: World, postgres: Postgres) -> None:
    url = postgres.database("tunnels")
    one = world.gateway(gateway_store_url=url, gateway_replica_id="r1")
    two = world.gateway(gateway_store_url=url, gateway_replica_id="r2")
    tunnel = create_tunnel(one, "acme", "span")
    config = world.config(one, tunnel["id"], tunnel["token"], name="span")  # polls replica 1
    connector = world.start_connector(config, name="span")
    try:
        with httpx.Client(base_url=two.url, headers={"Authorization": f"Bearer {TENANT_KEY}"},
                          timeout=60) as c:  # fmt: skip
            names = {t["name"] for t in c.get("/v1/tools").json()}
            assert "span__lookup" in names and "span__a__echo" in names
            for key in ("p1", "p2", "p3"):
                r = c.post("/v1/sessions/span-s/tools/span__lookup", json={"key": key})
                assert r.status_code == 200, r.text
                assert r.json()["content"][0]["text"].startswith(f"value-of-{key}")
            r = c.post("/v1/sessions/span-s/tools/span__a__echo", json={"text": "x"})
            assert r.status_code == 200 and "stdio echo: x" in r.json()["content"][0]["text"]
            events = c.get("/v1/sessions/span-s/timeline").json()["events"]
        assert [e["replica"] for e in events if e["kind"] == "tunnel_call"] == ["r2"] * 4
    finally:
        stop(connector)
