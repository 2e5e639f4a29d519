"""Attacks against the E2B-compatible server and the agents behind it: tokens that reach the
wrong sandbox, forged signatures, floods, a 1 GiB upload, endless output, thousands of watchers,
slow clients. The server must refuse or survive, and keep serving everyone else."""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, TimeoutException

from tests.support.e2b_server import KEY_A, Server, new_server

GIB = 1 << 30


def _hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _agent_pid(srv: Server, sandbox_id: str) -> int:
    info = srv.runtime().get(sandbox_id)
    for pid in srv.runtime().cgroup(sandbox_id).pids():
        try:
            if b"agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except FileNotFoundError:
            pass
    raise AssertionError(f"no agent in {info.id}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of this module's own, addressed explicitly: the attacks must not disturb the
    e2b suite's server, and no process-wide E2B_* variables are set."""
    srv = new_server(tmp_path_factory.mktemp("attacks"))
    srv.start()
    yield srv
    srv.destroy()


@pytest.fixture(scope="module")
def pair(server: Server) -> Iterator[tuple[Sandbox, Sandbox]]:
    opts = {"api_url": server.url, "sandbox_url": server.url, "api_key": KEY_A}
    a = Sandbox.create(timeout=900, **opts)
    b = Sandbox.create(timeout=900, **opts)
    yield a, b
    a.kill()
    b.kill()


def _sandbox_headers(sbx: Sandbox, token: str | None, port: int = 49983) -> dict[str, str]:
    h = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port)}
    if token:
        h["X-Access-Token"] = token
    return h


def test_one_sandboxs_token_does_not_open_another(server: Server, pair) -> None:
    a, b = pair
    b.files.write("/home/user/b-secret", "only b")
    token_a = a._envd_access_token
    assert token_a and token_a != b._envd_access_token
    with httpx.Client(base_url=server.url, timeout=30) as c:
        r = c.get("/files", params={"path": "/home/user/b-secret"},
                  headers=_sandbox_headers(b, token_a))  # fmt: skip
        assert r.status_code == 401 and b"only b" not in r.content
        r = c.post("/process.Process/List", json={}, headers=_sandbox_headers(b, token_a))
        assert r.status_code == 401
        # Nor through another port of the same sandbox (the tunnel to in-sandbox services).
        r = c.get("/", headers=_sandbox_headers(b, token_a, port=8080))
        assert r.status_code in (401, 403)


def test_forged_and_replayed_file_signatures_are_refused(server: Server, pair) -> None:
    a, b = pair
    b.files.write("/home/user/b-secret", "only b")

    def sign(path: str, token: str) -> str:
        raw = hashlib.sha256(f"{path}:read::{token}".encode()).digest()
        return "v1_" + base64.b64encode(raw).decode().rstrip("=")

    with httpx.Client(base_url=server.url, timeout=30) as c:
        for forged in (sign("/home/user/b-secret", "guess"), "v1_" + "A" * 43, ""):
            r = c.get("/files", params={"path": "/home/user/b-secret", "signature": forged})
            assert r.status_code == 401 and b"only b" not in r.content
        # A genuine URL signed by a's token reads a's file system, never b's.
        url = a.download_url("/home/user/b-secret")
        r = httpx.get(url, timeout=30)
        assert b"only b" not in r.content


def test_request_flood_is_survived(server: Server, pair) -> None:
    a, _ = pair
    headers = {"X-API-KEY": KEY_A}

    def hit(i: int) -> int:
        if i % 2:
            return httpx.get(f"{server.url}/v2/sandboxes", headers=headers, timeout=60).status_code
        return httpx.get(f"{server.url}/health", headers=_sandbox_headers(a, None),
                         timeout=60).status_code  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        codes = list(pool.map(hit, range(1000)))
    assert set(codes) <= {200, 204, 429, 503}
    assert a.commands.run("echo still serving").stdout == "still serving\n"


def test_slow_clients_do_not_block_others(server: Server, pair) -> None:
    a, _ = pair
    slow = []
    try:
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(b"POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
            slow.append(s)
        assert a.commands.run("echo served").stdout == "served\n"
        assert httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-KEY": KEY_A},
                         timeout=30).status_code == 200  # fmt: skip
    finally:
        for s in slow:
            s.close()


def test_a_1_gib_upload_is_streamed_not_buffered(server: Server, pair) -> None:
    a, _ = pair
    agent = _agent_pid(server, a.sandbox_id)
    chunk = b"\0" * (1 << 20)

    def body():
        for _ in range(GIB // len(chunk)):
            yield chunk

    headers = {
        **_sandbox_headers(a, a._envd_access_token),
        "Content-Type": "application/octet-stream",
    }
    r = httpx.post(f"{server.url}/files", params={"path": "/home/user/big.bin"}, content=body(),
                   headers=headers, timeout=600)  # fmt: skip
    assert r.status_code == 200, r.text
    assert a.files.get_info("/home/user/big.bin").size == GIB
    assert _hwm_mib(server.proc.pid) < 300, "the server buffered the upload"
    assert _hwm_mib(agent) < 128, "the agent buffered the upload"
    a.files.remove("/home/user/big.bin")


def test_endless_output_is_bounded(server: Server, pair) -> None:
    a, _ = pair
    agent = _agent_pid(server, a.sandbox_id)
    with pytest.raises(TimeoutException):
        a.commands.run("yes flood", timeout=3)
    # A background flood nobody reads must not grow the agent's memory either.
    handle = a.commands.run("yes flood", background=True)
    time.sleep(3)
    assert _hwm_mib(agent) < 128, "the agent kept unread output in memory"
    handle.kill()
    assert a.commands.run("echo calm").stdout == "calm\n"


def test_thousands_of_watchers_do_not_exhaust_the_agent(server: Server, pair) -> None:
    a, _ = pair
    agent = _agent_pid(server, a.sandbox_id)
    a.files.make_dir("/home/user/watched")
    headers = {**_sandbox_headers(a, a._envd_access_token), "Connect-Protocol-Version": "1"}
    created, refused = 0, 0
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
        for _ in range(3000):
            r = c.post("/filesystem.Filesystem/CreateWatcher",
                       json={"path": "/home/user/watched", "recursive": False})  # fmt: skip
            if r.status_code == 200:
                created += 1
            else:
                assert r.json()["code"] in ("resource_exhausted", "unavailable", "internal")
                refused += 1
    assert created + refused == 3000
    assert _hwm_mib(agent) < 128
    assert a.commands.run("echo responsive").stdout == "responsive\n"
