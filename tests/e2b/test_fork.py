"""Fork through the official SDK: ``sbx.fork(count=...)`` gives running sandboxes that carry
the source's processes and memory, with their own files, ids and envd tokens; the source keeps
its id and end time; another team cannot fork it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2b import Sandbox, SandboxException

from tests.e2b.test_suspend import COUNTER, state
from tests.support.e2b_server import KEY_B, Server, needs_criu, new_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    needs_criu()
    srv = new_server(tmp_path_factory.mktemp("fork"))
    srv.start()
    yield srv
    srv.destroy()


def test_fork_carries_memory_into_independent_sandboxes(server):
    src = Sandbox.create(timeout=300, **server.sdk())
    forks: list[Sandbox] = []
    try:
        src.commands.run(COUNTER, background=True)
        src.files.write("/home/user/shared.txt", "from the source")
        n0, secret = state(src)
        end_before = src.get_info().end_at
        got = src.fork(count=2, timeout=120)
        forks = [f for f in got if isinstance(f, Sandbox)]
        assert len(forks) == 2, got
        assert len({src.sandbox_id, *(f.sandbox_id for f in forks)}) == 3
        time.sleep(0.1)
        for f in forks:
            n, s = state(f)
            assert s == secret and n > n0
            assert f.files.read("/home/user/shared.txt") == "from the source"
        forks[0].files.write("/home/user/shared.txt", "fork 0")
        assert src.files.read("/home/user/shared.txt") == "from the source"
        assert forks[1].files.read("/home/user/shared.txt") == "from the source"
        assert src.get_info().end_at == end_before  # the source's end time is untouched
        assert src.commands.run("echo ok").stdout == "ok\n"
        # Each fork's envd token is its own: one fork's token does not open another.
        assert forks[0]._envd_access_token != forks[1]._envd_access_token
    finally:
        for s in (*forks, src):
            s.kill()


def test_another_team_cannot_fork(server):
    src = Sandbox.create(timeout=120, **server.sdk())
    try:
        with pytest.raises(SandboxException):
            Sandbox.fork(src.sandbox_id, count=1, **server.sdk(KEY_B))
        listed = Sandbox.list(**server.sdk()).next_items()
        assert [s.sandbox_id for s in listed] == [src.sandbox_id]
    finally:
        src.kill()
