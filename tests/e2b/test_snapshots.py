"""Snapshots through the official SDK: persistent, named, a team's own; a full one restores a
process's memory into a new sandbox after its source is gone; a filesystem one cold-boots over
the saved files; a deleted one cannot be used."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2b import Sandbox, SandboxException

from sandhold.config import Settings
from sandhold.runtime.checkpoint.criu import criu_status
from tests.e2b.test_suspend import COUNTER, state
from tests.support.e2b_server import KEY_B, Server, new_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = new_server(tmp_path_factory.mktemp("snapshots"))
    srv.start()
    yield srv
    srv.destroy()


def test_full_snapshot_restores_memory_after_its_source_is_gone(server):
    if not criu_status(Settings().criu_path)[0]:
        pytest.skip("CRIU unusable here")
    src = Sandbox.create(timeout=300, **server.sdk())
    src.commands.run(COUNTER, background=True)
    src.files.write("/home/user/notes.txt", "saved")
    n0, secret = state(src)
    snap = src.create_snapshot(name="counter")
    assert snap.names == ["counter"]
    src.kill()
    listed = Sandbox.list_snapshots(**server.sdk()).next_items()
    assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
    # Another team sees nothing, and cannot use or delete it.
    assert Sandbox.list_snapshots(**server.sdk(KEY_B)).next_items() == []
    with pytest.raises(SandboxException):
        Sandbox.create(snap.snapshot_id, **server.sdk(KEY_B))
    assert Sandbox.delete_snapshot(snap.snapshot_id, **server.sdk(KEY_B)) is False
    restored = Sandbox.create(snap.snapshot_id, timeout=120, **server.sdk())
    try:
        time.sleep(0.1)
        n1, secret1 = state(restored)
        assert secret1 == secret and n1 > n0  # the process, from the saved memory
        assert restored.files.read("/home/user/notes.txt") == "saved"
        by_name = Sandbox.create("counter", timeout=120, **server.sdk())  # its name works too
        assert state(by_name)[1] == secret
        by_name.kill()
    finally:
        restored.kill()
    assert Sandbox.delete_snapshot(snap.snapshot_id, **server.sdk()) is True
    with pytest.raises(SandboxException):
        Sandbox.create(snap.snapshot_id, **server.sdk())
    assert Sandbox.list_snapshots(**server.sdk()).next_items() == []


def test_filesystem_snapshot_cold_boots_over_the_files(server):
    src = Sandbox.create(timeout=300, **server.sdk())
    try:
        src.commands.run(COUNTER, background=True)
        src.files.write("/home/user/notes.txt", "saved")
        snap = src.create_snapshot(mode="filesystem")
        assert src.commands.run("echo still").stdout == "still\n"  # the source runs on
    finally:
        src.kill()
    booted = Sandbox.create(snap.snapshot_id, timeout=120, **server.sdk())
    try:
        assert booted.files.read("/home/user/notes.txt") == "saved"
        r = booted.commands.run("ps -eo args | grep -c '[t]oken_hex' || true")
        assert r.stdout.strip() == "0"  # files kept, processes not
    finally:
        booted.kill()
        Sandbox.delete_snapshot(snap.snapshot_id, **server.sdk())
