"""``get_host(port)`` through the official SDK: the server gives its sandbox domain, and a
request to ``{port}-{id}.{domain}`` (the name resolved to this loopback server, as wildcard DNS
would) reaches that port, resumes a paused sandbox that auto-resumes, and asks for the traffic
token when public traffic is off."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from tests.e2b.test_routing import ECHO_HOST, WAIT_FOR_8000
from tests.support.e2b_server import KEY_A, Server, new_server

DOMAIN = "sandboxes.sandhold.test"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("hosts"), public_domain=DOMAIN)
    srv.start()
    yield srv
    srv.destroy()


def test_get_host_routes_resumes_and_guards(server: Server) -> None:
    kw = {"api_url": server.url, "sandbox_url": server.url, "api_key": KEY_A}
    sbx = Sandbox.create(timeout=300, network={"allow_public_traffic": False},
                         lifecycle={"on_timeout": "pause", "auto_resume": True}, **kw)  # fmt: skip
    try:
        sbx.files.write("/tmp/echo.py", ECHO_HOST)
        sbx.files.write("/tmp/wait.py", WAIT_FOR_8000)
        sbx.commands.run("python3 /tmp/echo.py", background=True)
        sbx.commands.run("python3 /tmp/wait.py")
        host = sbx.get_host(8000)
        assert host == f"8000-{sbx.sandbox_id}.{DOMAIN}"
        token = {"E2B-Traffic-Access-Token": sbx.traffic_access_token or ""}
        with httpx.Client(base_url=server.url, headers={"Host": host}) as c:
            assert c.get("/x").status_code == 403  # no public traffic: the token is asked for
            assert c.get("/x", headers=token).text == f"host={host} path=/x"
            sbx.pause()
            r = c.get("/after-pause", headers=token)  # traffic resumes it
            assert r.status_code == 200 and r.text.endswith("path=/after-pause"), r.text
        assert sbx.is_running()
    finally:
        sbx.kill()
