"""`sandhold serve` holds no descriptor for a sandbox that is gone: after many create → run →
pause → kill cycles through the official SDK, its open descriptors are back to their count
before the cycles (give or take a few: logs, pools). Before, each killed sandbox's kept-alive
connection to its agent stayed open (asyncio leaves a stream half-open at its peer's EOF)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.support.e2b_server import Server, new_server

CYCLES = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("descriptors"))
    srv.start()
    yield srv
    srv.destroy()


def descriptors(server: Server) -> int:
    assert server.proc is not None
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def cycle(server: Server) -> None:
    sbx = Sandbox.create(**server.sdk())
    assert sbx.commands.run("echo ok").stdout == "ok\n"
    sbx.files.write("/tmp/x", "x")
    sbx.pause()
    sbx.kill()


def test_killed_sandboxes_leave_no_descriptor_behind(server: Server) -> None:
    for _ in range(3):  # (what the first ones open for good: pools, caches, the log)
        cycle(server)
    before = descriptors(server)
    for _ in range(CYCLES):
        cycle(server)
    after = descriptors(server)
    assert after - before <= 10, f"{after - before} more descriptors after {CYCLES} cycles"
