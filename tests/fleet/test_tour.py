"""The official SDKs' tour through a fleet's edge, as against one server (docs/fleet.md): stdin,
PTY, watch, metrics, fork, snapshots, list pages, the code interpreter; and an edge killed under a
streaming command, the client carrying on through the other edge."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import CommandExitException, PtySize, Sandbox, SandboxQuery
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType
from e2b_code_interpreter import Sandbox as CodeSandbox

from tests.counter import COUNTER
from tests.e2b.test_suspend import state
from tests.fleet.harness import Edge, catalog_url, host_of, new_host, running
from tests.support.e2b_server import Server, needs_criu
from tests.support.interpreter import InterpreterServer


@pytest.fixture(scope="module")
def fleet(postgres, tmp_path_factory) -> Iterator[tuple[list[Server], list[Edge]]]:  # type: ignore[no-untyped-def]
    needs_criu()
    tmp: Path = tmp_path_factory.mktemp("fleet-tour")
    hosts: list[Server] = []
    for i in (1, 2):
        srv = new_host(tmp, f"t{i}")
        srv.__class__ = InterpreterServer  # (its template built in the data dir)
        srv.build_template()  # type: ignore[attr-defined]
        hosts.append(srv)
    url = catalog_url(postgres)
    edges = [Edge(tmp, url, hosts) for _ in range(2)]
    with running(hosts, edges):
        yield hosts, edges


def test_the_sdks_tour_through_the_edge(fleet) -> None:  # type: ignore[no-untyped-def]
    hosts, (one, two) = fleet
    made: list[Sandbox] = []
    try:
        sbx = Sandbox.create(timeout=300, metadata={"case": "tour"}, **one.sdk())
        made.append(sbx)
        h = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(h.pid, "hello\n")
        sbx.commands.close_stdin(h.pid)
        assert h.wait().stdout == "hello\n"
        pty = sbx.pty.create(PtySize(rows=24, cols=80))
        sbx.pty.send_stdin(pty.pid, b"stty size; exit 3\n")
        out = bytearray()
        with pytest.raises(CommandExitException):
            pty.wait(on_pty=out.extend)
        assert b"24 80" in out
        sbx.files.make_dir("/tmp/watched")
        watch = sbx.files.watch_dir("/tmp/watched")
        try:
            sbx.files.write("/tmp/watched/new.txt", "1")
            events: list = []  # type: ignore[type-arg]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not events:
                events = watch.get_new_events()
                time.sleep(0.05)
            assert any(e.name == "new.txt" and e.type == FilesystemEventType.CREATE for e in events)
        finally:
            watch.stop()
        deadline = time.monotonic() + 30
        while not (metrics := sbx.get_metrics()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert metrics and metrics[0].mem_total > 0
        # fork: on the source's host, listed through the other edge at once
        sbx.commands.run(COUNTER, background=True)
        n0, secret = state(sbx)
        forks = [f for f in sbx.fork(count=1, timeout=120) if isinstance(f, Sandbox)]
        made += forks
        (fork,) = forks
        assert host_of(next(h for h in hosts if host_of(h, sbx.sandbox_id)), fork.sandbox_id)
        n1, secret1 = state(Sandbox.connect(fork.sandbox_id, **two.sdk()))
        assert secret1 == secret and n1 > n0
        # a snapshot, and a sandbox started from it
        snap = sbx.create_snapshot(name="tour")
        from_snap = Sandbox.create(snap.snapshot_id, timeout=120, **two.sdk())
        made.append(from_snap)
        assert state(from_snap)[1] == secret
        # list pages: every sandbox of the case (a fork and a snapshot's sandbox carry their
        # source's metadata), one per page, through the other edge
        made.append(Sandbox.create(timeout=120, metadata={"case": "tour"}, **one.sdk()))
        made.append(Sandbox.create(timeout=120, metadata={"case": "tour"}, **two.sdk()))
        pages = Sandbox.list(query=SandboxQuery(metadata={"case": "tour"}), limit=1, **two.sdk())
        seen: list[str] = []
        while pages.has_next:
            seen += [s.sandbox_id for s in pages.next_items()]
        assert sorted(seen) == sorted(s.sandbox_id for s in made) and len(seen) == 5
    finally:
        for s in made:
            s.kill()


def test_the_code_interpreter_through_the_edge(fleet) -> None:  # type: ignore[no-untyped-def]
    _, (one, _) = fleet
    sbx = CodeSandbox.create(timeout=300, **one.sdk())
    try:
        assert sbx.run_code("x = 21").error is None
        assert sbx.run_code("x * 2").text == "42"
        js = sbx.run_code("[1, 2].map(n => n * 3).join(',')", language="js")
        assert js.text == "'3,6'" or js.text == "3,6", js
    finally:
        sbx.kill()


def test_an_edge_killed_mid_stream_the_client_carries_on(fleet) -> None:  # type: ignore[no-untyped-def]
    _, (one, two) = fleet
    sbx = Sandbox.create(timeout=300, metadata={"case": "failover"}, **one.sdk())
    try:
        ticker = sbx.commands.run(
            "for i in $(seq 1 30); do echo $i >> /tmp/ticks; sleep 0.1; done",
            background=True,
        )
        time.sleep(0.5)
        one.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        one.proc.wait()  # type: ignore[union-attr]
        # The client goes on through the other edge (the same catalog).
        again = Sandbox.connect(sbx.sandbox_id, **two.sdk())
        handle = again.commands.connect(ticker.pid)
        assert handle.wait().exit_code == 0  # the command ran on, whole
        assert again.files.read("/tmp/ticks").split()[-1] == "30"
        listed = Sandbox.list(query=SandboxQuery(metadata={"case": "failover"}), **two.sdk())
        assert [s.sandbox_id for s in listed.next_items()] == [sbx.sandbox_id]
    finally:
        Sandbox.kill(sbx.sandbox_id, **two.sdk())
        one.proc = None
        one.start()
