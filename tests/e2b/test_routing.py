"""Routing of sandbox traffic: headers, Host names, concurrency, and ports other than envd's."""

from __future__ import annotations

import asyncio

import httpx
from e2b import AsyncSandbox, Sandbox

from tests.support.e2b_server import Server

ECHO_HOST = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("host=" + self.headers["Host"] + " path=" + self.path).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""
# Waits (inside the sandbox) until the echo server listens: from then on, anything but a 200
# through the tunnel is a bug, not a reason to retry.
WAIT_FOR_8000 = """
import socket, time
deadline = time.monotonic() + 20
while True:
    try:
        socket.create_connection(("127.0.0.1", 8000), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
"""


async def test_ten_sandboxes_at_once(server: Server) -> None:
    sandboxes = await asyncio.gather(*(AsyncSandbox.create(timeout=120) for _ in range(10)))
    try:
        assert len({s.sandbox_id for s in sandboxes}) == 10

        async def work(i: int, s: AsyncSandbox) -> str:
            await s.files.write("/home/user/me.txt", f"sandbox {i}")
            r = await s.commands.run("cat me.txt; ls /home/user | wc -l; hostname")
            return r.stdout

        outs = await asyncio.gather(*(work(i, s) for i, s in enumerate(sandboxes)))
        for i, out in enumerate(outs):
            assert out == f"sandbox {i}1\nsandbox\n"  # each sees only its own file
        infos = await asyncio.gather(*(s.get_info() for s in sandboxes))
        assert all(info.state == "running" for info in infos)
    finally:
        await asyncio.gather(*(s.kill() for s in sandboxes))
    assert not any(await asyncio.gather(*(s.is_running() for s in sandboxes)))


def test_host_based_routing(server: Server, sbx: Sandbox) -> None:
    token = sbx._envd_access_token or ""
    host = f"49983-{sbx.sandbox_id}.sandhold.test"
    with httpx.Client(base_url=server.url, headers={"Host": host}) as c:
        assert c.get("/health").status_code == 204
        r = c.post("/filesystem.Filesystem/Stat", json={"path": "/home/user"},
                   headers={"X-Access-Token": token,
                            "Connect-Protocol-Version": "1"})  # fmt: skip
        assert r.status_code == 200 and r.json()["entry"]["name"] == "user"
        ghost = c.get("/health", headers={"Host": f"49983-{'z' * 20}.sandhold.test"})
        assert ghost.status_code == 502


async def test_other_ports_through_the_tunnel(server: Server) -> None:
    s = Sandbox.create(timeout=120, network={"mask_request_host": "masked:${PORT}"})
    try:
        s.files.write("/tmp/echo.py", ECHO_HOST)
        s.files.write("/tmp/wait.py", WAIT_FOR_8000)
        s.commands.run("python3 /tmp/echo.py", background=True)
        s.commands.run("python3 /tmp/wait.py")
        headers = {"E2b-Sandbox-Id": s.sandbox_id, "E2b-Sandbox-Port": "8000",
                   "E2B-Traffic-Access-Token": s.traffic_access_token or ""}  # fmt: skip
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as c:
            r = await c.get("/some/path?q=1")
            assert r.status_code == 200, r.text
            assert r.text == "host=masked:8000 path=/some/path?q=1"
            rs = await asyncio.gather(*(c.get(f"/{i}") for i in range(10)))
            assert [x.text.endswith(f"path=/{i}") for i, x in enumerate(rs)] == [True] * 10
    finally:
        s.kill()
