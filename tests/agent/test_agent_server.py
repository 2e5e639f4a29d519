"""The agent as a server: start-up, socket, HTTP behaviour, system endpoints, shutdown, memory."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import time

import httpx

from tests.agent.helpers import command, gone, ok, open_stream, run
from tests.support.agent import start_agent


async def test_socket_is_private(agent):
    mode = os.stat(agent.socket_path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


async def test_health_envs_metrics(agent):
    r = await agent.client.get("/health")
    assert r.status_code == 204 and r.content == b""
    r = await agent.client.get("/envs")
    assert r.json() == {"SANDHOLD_TEST": "1"}
    r = await agent.client.get("/metrics")
    m = r.json()
    assert set(m) == {
        "ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache",
        "mem_total_mib", "mem_used_mib", "disk_used", "disk_total",
    }  # fmt: skip
    assert abs(m["ts"] - time.time()) < 5
    assert m["cpu_count"] >= 1 and 0 <= m["cpu_used_pct"] <= 100
    assert 0 < m["mem_used"] < m["mem_total"]
    assert m["mem_total_mib"] == m["mem_total"] >> 20
    assert 0 < m["disk_used"] < m["disk_total"]


async def test_unknown_routes_and_bad_requests(agent):
    assert (await agent.client.get("/nope")).status_code == 404
    assert (await agent.client.get("/process.Process/List")).status_code == 405
    r = await agent.client.post(
        "/process.Process/List", content=b"{}", headers={"Content-Type": "application/proto"}
    )
    assert r.status_code == 415
    r = await agent.client.post(
        "/process.Process/List", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"


async def test_keep_alive_and_chunked_unary_bodies(agent):
    async def body():
        yield b'{"pa'
        await asyncio.sleep(0.01)
        yield b'th": "/"}'

    for _ in range(3):
        r = await agent.client.post(
            "/filesystem.Filesystem/Stat",
            content=body(),
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 200
        assert r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    # the three requests above reused one connection
    pool = agent.client._transport._pool  # type: ignore[attr-defined]
    assert len(pool.connections) == 1


async def test_many_concurrent_connections(agent):
    transport = httpx.AsyncHTTPTransport(
        uds=agent.socket_path, limits=httpx.Limits(max_connections=300)
    )
    async with httpx.AsyncClient(transport=transport, base_url="http://sandbox", timeout=30) as c:
        streams = [
            open_stream(c, "process.Process/Start", command("sleep 1; echo x")) for _ in range(100)
        ]
        firsts = await asyncio.gather(*(anext(s) for s in streams))
        assert all("start" in m["event"] for _, m in firsts)
        health = await asyncio.gather(*(c.get("/health") for _ in range(100)))
        assert {r.status_code for r in health} == {204}
        for s in streams:
            await s.aclose()


async def test_client_disconnect_stops_stream_not_process(agent):
    # a quiet command: only EOF on the socket tells the agent the client has gone
    starter = open_stream(
        agent.client, "process.Process/Start", command("sleep 1.5; echo finished")
    )
    _, first = await anext(starter)
    pid = first["event"]["start"]["pid"]
    await starter.aclose()
    res = await run(agent.client, f"sleep 0.2; ls /proc/{os.getpid()} >/dev/null; echo alive")
    assert res.output() == b"alive\n"
    listing = await ok(agent.client, "process.Process/List", {})
    assert pid in [p["pid"] for p in listing["processes"]]


async def test_sigterm_exits_cleanly_and_kills_commands():
    async with start_agent() as a:
        gen = open_stream(a.client, "process.Process/Start", command("sleep 60"))
        _, first = await anext(gen)
        pid = first["event"]["start"]["pid"]
        os.kill(a.pid, signal.SIGTERM)
        for _ in range(100):
            if gone(a.pid):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("agent did not exit on SIGTERM")
        assert not os.path.exists(a.socket_path)
        await asyncio.sleep(0.1)
        assert gone(pid)
        try:
            await gen.aclose()
        except Exception:
            pass


async def test_default_user_and_workdir_from_config():
    async with start_agent(default_user="nobody", default_workdir="/tmp") as a:
        res = await run(a.client, "id -un; pwd")
        assert res.output() == b"nobody\n/tmp\n"
        res = await run(a.client, "id -un", user="root")
        assert res.output() == b"root\n"


async def _pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


async def test_idle_memory_is_small(agent):
    # exercise most code paths first, then measure
    await run(agent.client, "echo warm")
    await ok(agent.client, "filesystem.Filesystem/ListDir", {"path": "/"})
    await agent.client.post(
        "/files", params={"path": str(agent.workdir / "m")}, content=b"x",
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    await agent.client.get("/files", params={"path": str(agent.workdir / "m")})
    wid = await ok(
        agent.client, "filesystem.Filesystem/CreateWatcher", {"path": str(agent.workdir)}
    )
    await ok(agent.client, "filesystem.Filesystem/RemoveWatcher", wid)
    pss = await _pss_kib(agent.pid)
    print(f"agent PSS after warm-up: {pss} KiB")
    assert pss < 16 * 1024


async def test_config_is_parsed_from_file(agent):
    with open(os.path.join(os.path.dirname(agent.socket_path), "agent.json")) as f:
        cfg = json.load(f)
    assert cfg["socket"] == agent.socket_path


async def test_connect_tunnel_to_a_loopback_port(agent):
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(b"echo:" + data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_unix_connection(agent.socket_path)
        # the first payload bytes travel in the same write as the request
        writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\nhello".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert await reader.readexactly(10) == b"echo:hello"
        writer.write(b"again")
        assert await reader.readexactly(10) == b"echo:again"
        writer.write_eof()
        assert await reader.read() == b""  # the upstream closed after our half-close
        writer.close()
    finally:
        server.close()

    async def connect(authority: str) -> bytes:
        reader, writer = await asyncio.open_unix_connection(agent.socket_path)
        writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        return head.split(b"\r\n", 1)[0]

    assert await connect(f"127.0.0.1:{port}") == b"HTTP/1.1 502 Bad Gateway"  # now closed
    assert await connect("10.0.0.1:80") == b"HTTP/1.1 403 Forbidden"
    assert await connect("127.0.0.1:nope") == b"HTTP/1.1 400 Bad Request"


async def test_services_start_at_boot(tmp_path):
    out = tmp_path / "service.out"
    services = [
        {"name": "ghost-svc", "argv": ["/bin/true"], "user": "ghost"},  # refused: unknown user
        {"name": "broken", "argv": ["/no/such/binary"], "cwd": "/tmp"},  # refused: no binary
        {"name": "web", "argv": ["/bin/sh", "-c", "echo $A > $OUT; exec sleep 30"],
         "env": {"A": "from-service", "OUT": str(out)}, "user": "root", "cwd": "/tmp"},
    ]  # fmt: skip
    async with start_agent(services=services) as a:
        # The agent is ready before its services are up: they start right after.
        for _ in range(100):
            listing = (await ok(a.client, "process.Process/List", {}))["processes"]
            if listing:
                break
            await asyncio.sleep(0.05)
        assert [(p["tag"], p["config"]["cwd"]) for p in listing] == [("web", "/tmp")]
        for _ in range(50):
            if out.exists() and out.read_text():
                break
            await asyncio.sleep(0.05)
        assert out.read_text() == "from-service\n"
        await ok(a.client, "process.Process/SendSignal",
                 {"process": {"tag": "web"}, "signal": "SIGNAL_SIGKILL"})  # fmt: skip
        log = os.path.join(os.path.dirname(a.socket_path), "agent.log")
        for _ in range(50):
            with open(log) as f:
                text = f.read()
            if "service web ended" in text:
                break
            await asyncio.sleep(0.05)
        assert (await ok(a.client, "process.Process/List", {}))["processes"] == []
        assert "service ghost-svc did not start" in text
        assert "service broken did not start" in text
        assert "service web ended (signal: killed)" in text
