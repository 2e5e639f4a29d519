"""A template built on `base` gets a writable /usr/local of its own (a bind of a directory in the
sandbox's root over the host's read-only /usr). Restored from a checkpoint, each sandbox keeps
its own: a fork does not write its source's, and a warm start (which used to fail on this bind
and boot cold, every time) gets its own, not its maker's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox, Template, wait_for_port

from tests.fleet.harness import scrape, wait_for
from tests.support.e2b_server import Server, needs_criu, new_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    needs_criu()
    srv = new_server(tmp_path_factory.mktemp("rw-dirs"))
    srv.start()
    yield srv
    srv.destroy()


def mine(sbx: Sandbox) -> str:
    return sbx.commands.run("cat /usr/local/mine").stdout.strip()


def test_a_fork_writes_its_own_usr_local_not_its_sources(server: Server) -> None:
    tpl = Template().from_base_image().run_cmd("sudo sh -c 'echo built > /usr/local/mine'")
    Template.build(tpl, "rw-fork", **server.sdk())
    src = Sandbox.create("rw-fork", timeout=120, **server.sdk())
    forks: list[Sandbox] = []
    try:
        assert mine(src) == "built"
        src.commands.run("sudo sh -c 'echo source > /usr/local/mine'")
        forks = [f for f in src.fork(count=1, timeout=120) if isinstance(f, Sandbox)]
        assert len(forks) == 1
        assert mine(forks[0]) == "source"  # what the source had written, carried over
        forks[0].commands.run("sudo sh -c 'echo fork > /usr/local/mine'")
        assert (mine(src), mine(forks[0])) == ("source", "fork")
    finally:
        for s in (*forks, src):
            s.kill()


def test_a_warm_start_of_a_template_built_on_base_is_warm_and_its_own(server: Server) -> None:
    tpl = (
        Template()
        .from_base_image()
        .run_cmd("sudo sh -c 'echo built > /usr/local/mine'")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )
    Template.build(tpl, "rw-warm", **server.sdk())
    Sandbox.create("rw-warm", **server.sdk()).kill()  # cold; the server then makes its checkpoint
    warm = ("sandhold_create_duration_seconds_count", (("start", "warm"),))
    template = next(t for t in server.runtime().templates.list() if t.alias == "rw-warm" and t.tags)
    wait_for(lambda: server.runtime().warm.available(template), 120, "the checkpoint")
    before = scrape(server.url)[warm]
    first = Sandbox.create("rw-warm", **server.sdk())
    second = Sandbox.create("rw-warm", **server.sdk())
    try:
        assert scrape(server.url)[warm] == before + 2  # restored, not booted
        first.commands.run("sudo sh -c 'echo first > /usr/local/mine'")
        assert (mine(first), mine(second)) == ("first", "built")
    finally:
        first.kill()
        second.kill()
