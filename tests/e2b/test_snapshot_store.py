"""One snapshot store in S3 shared by two servers (separate data directories, the same bucket and
secrets keys), through the official SDK: a snapshot taken on one is listed and started on the
other, still a team's own; the bucket holds no plaintext of it; a tampered object fails
clearly and leaves nothing behind; a delete on either server removes it for both. The S3 store
is a real moto server on loopback."""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from e2b import Sandbox, SandboxException
from moto.server import ThreadedMotoServer

from sandhold.config import Settings
from sandhold.runtime.checkpoint.criu import criu_status
from tests.e2b.test_suspend import COUNTER, state
from tests.support.e2b_server import KEY_B, Server, new_server

BUCKET = "sandhold-snapshots"
PREFIX = "shared/"
MARKER = "plaintext-marker-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "test")  # the servers inherit these (boto3's chain)
        mp.setenv("AWS_SECRET_ACCESS_KEY", "test")
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()  # binds in this process: no port is released and taken again
        try:
            host, port = moto.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
                Bucket=BUCKET
            )
            yield endpoint
        finally:
            moto.stop()


@pytest.fixture(scope="module")
def s3(s3_endpoint: str) -> object:
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Iterator[list[Server]]:
    keys = f'["{base64.urlsafe_b64encode(os.urandom(32)).decode()}"]'  # the same on both
    tmp = tmp_path_factory.mktemp("snapshot-store")
    out: list[Server] = []
    try:
        for _ in range(2):
            srv = new_server(tmp, snapshot_s3_bucket=BUCKET, snapshot_s3_prefix=PREFIX,
                             snapshot_s3_endpoint_url=s3_endpoint,
                             snapshot_s3_region="us-east-1", secrets_keys=keys)  # fmt: skip
            out.append(srv)
            srv.start()
        yield out
    finally:
        for srv in out:
            srv.destroy()


def objects(s3) -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def holds(path: Path, text: str) -> bool:
    """Whether ``text`` is in a file or under a directory (grep: reads through the holes of a
    sparse disk image without holding it in memory)."""
    return subprocess.run(["grep", "-rqaF", text, str(path)]).returncode == 0


def local(server: Server, snapshot_id: str) -> list[str]:
    root = server.data_dir / "snapshots"
    return [p.name for p in root.iterdir() if snapshot_id in p.name] if root.is_dir() else []


def test_a_full_snapshot_taken_on_one_server_is_restored_on_the_other(servers, s3):
    if not criu_status(Settings().criu_path)[0]:
        pytest.skip("CRIU unusable here")
    one, two = servers
    src = Sandbox.create(timeout=300, **one.sdk())
    try:
        src.commands.run(COUNTER, background=True)
        src.files.write("/home/user/notes.txt", MARKER)
        n0, secret = state(src)
        snap = src.create_snapshot(name="shared")
    finally:
        src.kill()
    sid = snap.snapshot_id
    # Sealed: neither the file nor the secret held only in memory is in any object's bytes,
    # though both are in the server's own (root-only) copy.
    stored = objects(s3)
    assert f"{PREFIX}meta/{sid}" in stored and f"{PREFIX}data/{sid}/disk.img" in stored
    assert any(k.startswith(f"{PREFIX}data/{sid}/checkpoint/") for k in stored)
    for value in stored.values():
        assert MARKER.encode() not in value and secret.encode() not in value
        assert b"team-a" not in value and b"shared" not in value  # the metadata is sealed too
    assert holds(one.data_dir / "snapshots" / sid / "disk.img", MARKER)
    assert holds(one.data_dir / "snapshots" / sid / "checkpoint", secret)

    # The other server: team A lists it (known there only in S3) and restores its memory;
    # team B sees nothing and cannot use it.
    assert local(two, sid) == []
    assert Sandbox.list_snapshots(**two.sdk(KEY_B)).next_items() == []
    with pytest.raises(SandboxException):
        Sandbox.create(sid, **two.sdk(KEY_B))
    assert Sandbox.delete_snapshot(sid, **two.sdk(KEY_B)) is False
    assert [s.snapshot_id for s in Sandbox.list_snapshots(**two.sdk()).next_items()] == [sid]
    restored = Sandbox.create(sid, timeout=120, **two.sdk())
    try:
        time.sleep(0.1)
        n1, secret1 = state(restored)
        assert secret1 == secret and n1 > n0  # the process, from the saved memory
        assert restored.files.read("/home/user/notes.txt") == MARKER
        assert restored.sandbox_id != src.sandbox_id
    finally:
        restored.kill()
    assert local(two, sid) == [sid]  # downloaded once, kept as a local copy

    # A delete on the second server removes it from the bucket, and the first forgets it.
    assert Sandbox.delete_snapshot(sid, **two.sdk()) is True
    assert objects(s3) == {}
    assert Sandbox.list_snapshots(**one.sdk()).next_items() == []
    assert local(one, sid) == [] and local(two, sid) == []
    with pytest.raises(SandboxException):
        Sandbox.create("shared", **one.sdk())


def test_a_filesystem_snapshot_crosses_servers_and_a_tampered_object_fails(servers, s3):
    one, two = servers
    src = Sandbox.create(timeout=300, **one.sdk())
    try:
        src.commands.run(COUNTER, background=True)
        src.files.write("/home/user/notes.txt", MARKER)
        snap = src.create_snapshot(mode="filesystem")
    finally:
        src.kill()
    sid = snap.snapshot_id
    key = f"{PREFIX}data/{sid}/disk.img"
    good = objects(s3)[key]
    assert MARKER.encode() not in good
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(bad))
    with pytest.raises(SandboxException) as e:
        Sandbox.create(sid, timeout=120, **two.sdk())
    assert "tampered" in str(e.value) and "disk.img" in str(e.value), str(e.value)
    assert local(two, sid) == []  # nothing half-restored, no temporary left
    assert Sandbox.list(**two.sdk()).next_items() == []

    s3.put_object(Bucket=BUCKET, Key=key, Body=good)
    booted = Sandbox.create(sid, timeout=120, **two.sdk())
    try:
        assert booted.files.read("/home/user/notes.txt") == MARKER
        r = booted.commands.run("ps -eo args | grep -c '[t]oken_hex' || true")
        assert r.stdout.strip() == "0"  # files kept, processes not
    finally:
        booted.kill()
    assert Sandbox.delete_snapshot(sid, **one.sdk()) is True
    assert objects(s3) == {}
    assert Sandbox.list_snapshots(**two.sdk()).next_items() == []
