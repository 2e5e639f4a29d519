"""The runtime's pools (runtime/pool.py): a pooled sandbox takes the create's limits, env, user
and identity at hand-out, its agent takes a configuration once, and a create the pool cannot
serve boots and leaves the pool as it was."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandhold.config import Settings
from sandhold.runtime.client import AgentClient
from sandhold.runtime.pool import CONFIGURE
from sandhold.runtime.runtime import Runtime, SandboxInfo


@pytest.fixture
def pooled_runtime(data_dir: Path) -> Iterator[Runtime]:
    rt = Runtime(Settings(data_dir=data_dir, pool_sizes={"base": 1})).open()
    yield rt
    rt.pools.drain()


def run(info: SandboxInfo, script: str, user: str | None = None) -> str:
    async def go() -> str:
        async with AgentClient(info.agent_socket) as agent:
            r = await agent.run(["/bin/sh", "-c", script], user=user)
            return r.stdout.decode()

    return asyncio.run(go())


def post(info: SandboxInfo, path: str, body: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(info.agent_socket))
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: agent\r\nContent-Length: {len(body)}\r\n"
                  "Connection: close\r\n\r\n".encode() + body)  # fmt: skip
        return s.recv(4096)


def test_a_pooled_sandbox_takes_the_create_late(pooled_runtime: Runtime) -> None:
    rt = pooled_runtime
    pooled = rt.pools.fill("base")
    info = rt.create({"template": "base", "env": {"A": "1"}, "user": "root", "workdir": "/srv",
                      "limits": {"memory_mb": 300, "pids": 77}}, extra={"mine": True})  # fmt: skip
    try:
        assert (info.id, info.started_from, info.extra) == (pooled, "pool", {"mine": True})
        assert rt.get(info.id).spec.env == {"A": "1"}  # the record is the create's
        out = run(info, "echo $A $E2B_SANDBOX_ID $E2B_TEMPLATE_ID; whoami; pwd")
        assert out == f"1 {info.id} base\nroot\n/srv\n"
        cg = rt.cgroup(info.id)
        assert (cg.v1("memory") / "memory.limit_in_bytes").read_text().strip() == str(300 << 20)
        assert (cg.v1("pids") / "pids.max").read_text().strip() == "77"
        # Once handed out, its agent takes no other configuration.
        again = post(info, CONFIGURE, json.dumps({"socket": "/x", "env": {"A": "2"}}).encode())
        assert again.startswith(b"HTTP/1.1 409"), again
        assert run(info, "echo $A") == "1\n"
    finally:
        rt.kill(info.id)
    rt.pools.fill("base")  # a limit above the pooled one (RAM+swap raised first)
    bigger = rt.create({"template": "base", "limits": {"memory_mb": 3000}})
    try:
        assert bigger.started_from == "pool"
        memory = rt.cgroup(bigger.id).v1("memory")
        for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            if (memory / name).exists():
                assert (memory / name).read_text().strip() == str(3000 << 20), name
    finally:
        rt.kill(bigger.id)


def test_a_create_the_pool_cannot_serve_boots(pooled_runtime: Runtime, tmp_path: Path) -> None:
    rt = pooled_runtime
    pooled = rt.pools.fill("base")
    booted = [
        rt.create({"template": "base", "limits": {"disk_mb": 300}}),  # another budget
        rt.create({"template": "base", "network": {"mode": "allowlist"}}),  # egress
    ]
    try:
        assert [b.started_from for b in booted] == [None, None]
        assert pooled not in {b.id for b in booted} and rt.pools.ready("base") == 1
    finally:
        for b in booted:
            rt.kill(b.id)
    assert rt.pools.drain() == 1 and rt.pools.ready("base") == 0
