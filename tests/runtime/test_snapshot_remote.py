"""The S3 copy of the snapshot store (runtime/checkpoint/snapshot_remote.py) against a real moto
server on loopback: objects are sealed (no plaintext in the bucket), sparse images keep their holes,
and every way an object can be changed - a flipped byte, a cut, a swap with another object, another
key ring - fails with CheckpointFailed; an upload that fails leaves nothing in the bucket."""

from __future__ import annotations

import base64
import os
import time
import types
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from sandhold.config import Settings
from sandhold.errors import CheckpointFailed, QuotaExceeded, Unavailable
from sandhold.runtime.checkpoint import sealing
from sandhold.runtime.checkpoint.snapshot_remote import S3Remote
from sandhold.runtime.checkpoint.snapshots import SnapshotStore
from tests.runtime.helpers import sh

BUCKET = "snapshots"
MARKER = b"plaintext-marker-5f0c9e"
KEY = base64.urlsafe_b64encode(b"k" * 32).decode()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "test")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "test")
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        try:
            host, port = moto.get_host_and_port()
            yield f"http://{host}:{port}"
        finally:
            moto.stop()


@pytest.fixture
def s3(endpoint: str) -> Iterator[object]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    yield client
    for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=o["Key"])
    client.delete_bucket(Bucket=BUCKET)


def remote_settings(data_dir: Path, endpoint: str, key: str = KEY) -> Settings:
    return Settings(data_dir=data_dir, snapshot_s3_bucket=BUCKET, snapshot_s3_prefix="p/",
                    snapshot_s3_endpoint_url=endpoint, snapshot_s3_region="us-east-1",
                    secrets_keys=[key])  # fmt: skip


def make_snapshot(d: Path) -> dict[str, object]:
    d.mkdir()
    with open(d / "disk.img", "wb") as f:  # sparse: data, a 64 MiB hole, data
        f.write(MARKER * 1000)
        f.seek(64 << 20)
        f.write(os.urandom(2 * sealing.CHUNK + 5) + MARKER)  # records, parts
    (d / "checkpoint").mkdir()
    (d / "checkpoint" / "pages-1.img").write_bytes(MARKER * 10)
    (d / "checkpoint" / "empty.img").write_bytes(b"")
    return {"id": "snap-0123456789abcdef", "owner": "team-a", "names": []}


def objects(s3) -> dict[str, bytes]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    return {k: s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


def test_sealed_objects_round_trip_with_their_holes(tmp_path, endpoint, s3):
    remote = S3Remote(remote_settings(tmp_path, endpoint))
    meta = make_snapshot(tmp_path / "src")
    remote.put(meta, tmp_path / "src")
    stored = objects(s3)
    assert sorted(stored) == ["p/data/snap-0123456789abcdef/checkpoint/empty.img",
                              "p/data/snap-0123456789abcdef/checkpoint/pages-1.img",
                              "p/data/snap-0123456789abcdef/disk.img",
                              "p/meta/snap-0123456789abcdef"]  # fmt: skip
    assert all(MARKER not in v and b"team-a" not in v for v in stored.values())
    image = "p/data/snap-0123456789abcdef/disk.img"
    assert len(stored[image]) < 17 << 20  # the hole is not sent
    assert "-" in s3.head_object(Bucket=BUCKET, Key=image)["ETag"]  # a multipart upload
    here = {**meta, "remote": "s3://snapshots/p/"}  # (where it is kept, as seen from here)
    assert remote.list() == {meta["id"]: here} and remote.exists(str(meta["id"]))
    out = tmp_path / "out"
    out.mkdir()
    assert remote.fetch(str(meta["id"]), out) == here
    for rel in ("disk.img", "checkpoint/pages-1.img", "checkpoint/empty.img"):
        assert (out / rel).read_bytes() == (tmp_path / "src" / rel).read_bytes()
    assert os.stat(out / "disk.img").st_blocks * 512 < 20 << 20  # restored sparse
    assert remote.delete(str(meta["id"])) and objects(s3) == {}
    assert remote.list() == {} and not remote.delete(str(meta["id"]))


@pytest.mark.parametrize("change", ["flip", "cut", "swap", "drop", "key"])
def test_a_changed_object_does_not_open(tmp_path, endpoint, s3, change):
    remote = S3Remote(remote_settings(tmp_path, endpoint))
    meta = make_snapshot(tmp_path / "src")
    remote.put(meta, tmp_path / "src")
    data = "p/data/snap-0123456789abcdef/"
    body = objects(s3)[data + "disk.img"]
    if change == "flip":
        body = body[:5000] + bytes([body[5000] ^ 1]) + body[5001:]
    elif change == "cut":  # whole records gone from the end, the final one among them
        body = body[: len(body) // 2]
    elif change == "swap":  # another object of the same snapshot in its place
        body = objects(s3)[data + "checkpoint/pages-1.img"]
    if change == "drop":
        s3.delete_object(Bucket=BUCKET, Key=data + "checkpoint/pages-1.img")
    elif change != "key":
        s3.put_object(Bucket=BUCKET, Key=data + "disk.img", Body=body)
    other = S3Remote(remote_settings(tmp_path, endpoint, key=KEY if change != "key" else
                                     base64.urlsafe_b64encode(b"x" * 32).decode()))  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CheckpointFailed) as e:
        other.fetch(str(meta["id"]), out)
    assert "secrets_keys" in str(e.value) if change == "key" else "tampered" in str(e.value)


def test_a_failed_upload_leaves_nothing(tmp_path, endpoint, s3, monkeypatch):
    remote = S3Remote(remote_settings(tmp_path, endpoint))
    meta = make_snapshot(tmp_path / "src")
    real = remote.client.put_object

    def failing(**kw):  # the data is up, the metadata (the last object) fails
        if "/meta/" in kw["Key"]:
            raise remote.client.exceptions.NoSuchBucket({"Error": {"Code": "X"}}, "PutObject")
        return real(**kw)

    monkeypatch.setattr(remote.client, "put_object", failing)
    with pytest.raises(Unavailable, match="failed to upload"):
        remote.put(meta, tmp_path / "src")
    assert objects(s3) == {}
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


async def test_a_snapshot_whose_upload_fails_is_not_made(make_sandbox, runtime, endpoint, s3,
                                                         monkeypatch):  # fmt: skip
    source = await make_sandbox()
    await sh(source, "echo saved > /home/user/file")
    store = SnapshotStore(runtime)
    store.remote = S3Remote(remote_settings(runtime.settings.data_dir, endpoint))
    store.root.mkdir(mode=0o700, exist_ok=True)
    before = {s.id for s in store.list()}  # (other tests' local snapshots)
    entries = set(os.listdir(store.root))
    monkeypatch.setattr(store.remote, "_upload", _fail)
    with pytest.raises(Unavailable):
        store.take(source.id, "team-a", None, "filesystem")
    assert objects(s3) == {}
    assert set(os.listdir(store.root)) == entries  # no snapshot, no staging directory
    monkeypatch.undo()
    snap = store.take(source.id, "team-a", "again", "filesystem")  # and then it works
    assert {s.id for s in store.list()} - before == {snap.id}
    assert snap.remote == "s3://snapshots/p/"
    store.delete(snap.id)
    assert objects(s3) == {} and {s.id for s in store.list()} == before


def _fail(name: str, records: object) -> None:
    raise Unavailable(f"the S3 snapshot store failed to upload {name}: injected")


def test_local_copies_are_a_cache_within_the_budget(tmp_path, endpoint, s3):
    """Snapshots known only in S3 are listed and fetched on use; the budget evicts the least
    recently used copy that no start holds; one deleted elsewhere is dropped here too."""
    settings = remote_settings(tmp_path, endpoint).model_copy(update={"snapshot_store_max_mb": 50})
    runtime = types.SimpleNamespace(host=types.SimpleNamespace(settings=settings))
    store = SnapshotStore(runtime)  # type: ignore[arg-type]
    remote = store.remote
    assert remote is not None
    ids = []
    for i in range(2):
        src = tmp_path / f"src{i}"
        src.mkdir()
        (src / "disk.img").write_bytes(MARKER)
        snapshot_id = f"snap-{i:016x}"
        meta = {"id": snapshot_id, "owner": "team-a", "names": [f"n{i}"], "source": "sbx",
                "template": "base", "mode": "filesystem", "spec": {}, "created_at": time.time(),
                "size_bytes": 30 << 20, "extra": {}, "remote": remote.url}  # fmt: skip
        remote.put(meta, src)
        ids.append(snapshot_id)
    listed = store.list()
    assert [s.id for s in listed] == ids and not any(s.dir.exists() for s in listed)
    first, second = listed
    with store._in_use(first):  # fetched, and held
        assert (first.dir / "disk.img").read_bytes() == MARKER
        with pytest.raises(QuotaExceeded):  # 30 + 30 MiB > 50: the held copy stays
            store._fetch(second)
    with store._in_use(second):  # now the first one is evicted for it
        assert not first.dir.exists() and (second.dir / "disk.img").read_bytes() == MARKER
    assert sorted(os.listdir(store.root)) == [second.id]
    remote.delete(second.id)  # through another server
    assert [s.id for s in store.list()] == [first.id] and not second.dir.exists()
    store.delete(first.id)
    assert store.list() == [] and objects(s3) == {}
