"""Every `files` method of the SDK, signed upload/download URLs, and path games."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Iterator

import httpx
from e2b import AsyncSandbox, FileType, Sandbox
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

from tests.support.e2b_server import Server


def test_text_and_bytes(sbx: Sandbox) -> None:
    info = sbx.files.write("/home/user/t/hello.txt", "héllo\n")
    assert info.path == "/home/user/t/hello.txt" and info.type == FileType.FILE
    assert sbx.files.read("/home/user/t/hello.txt") == "héllo\n"
    blob = bytes(range(256)) * 4
    sbx.files.write("t/blob.bin", blob)  # relative to the user's home
    assert bytes(sbx.files.read("/home/user/t/blob.bin", format="bytes")) == blob
    assert sbx.commands.run("sha256sum t/blob.bin").stdout.split()[0] == (
        hashlib.sha256(blob).hexdigest()
    )


def test_write_many_list_exists_info(sbx: Sandbox) -> None:
    entries = [{"path": f"/tmp/many/d{i % 3}/f{i}.txt", "data": f"file {i}"} for i in range(30)]
    written = sbx.files.write_files(entries)  # type: ignore[arg-type]
    assert len(written) == 30
    top = sbx.files.list("/tmp/many")
    assert sorted(e.name for e in top) == ["d0", "d1", "d2"]
    assert all(e.type == FileType.DIR for e in top)
    deep = sbx.files.list("/tmp/many", depth=2)
    assert len([e for e in deep if e.type == FileType.FILE]) == 30
    assert sbx.files.exists("/tmp/many/d1/f1.txt")
    assert not sbx.files.exists("/tmp/many/d1/f2.txt")
    info = sbx.files.get_info("/tmp/many/d2/f5.txt")
    assert info.size == len("file 5") and info.type == FileType.FILE and info.name == "f5.txt"
    assert info.owner == "user"


def test_rename_remove_make_dir(sbx: Sandbox) -> None:
    assert sbx.files.make_dir("/tmp/mk/a/b") is True
    assert sbx.files.make_dir("/tmp/mk/a/b") is False  # already there
    sbx.files.write("/tmp/mk/a/b/x.txt", "x")
    moved = sbx.files.rename("/tmp/mk/a/b/x.txt", "/tmp/mk/y.txt")
    assert moved.path == "/tmp/mk/y.txt"
    assert not sbx.files.exists("/tmp/mk/a/b/x.txt")
    sbx.files.remove("/tmp/mk/a")
    assert [e.name for e in sbx.files.list("/tmp/mk")] == ["y.txt"]


def test_big_files_stream_both_ways(sbx: Sandbox) -> None:
    size = 24 * 1024 * 1024
    chunk = os.urandom(1024 * 1024)

    def chunks() -> Iterator[bytes]:
        for _ in range(size // len(chunk)):
            yield chunk

    sbx.files.write("/tmp/big.bin", chunks())  # an iterable: streamed, octet-stream
    want = hashlib.sha256(chunk * (size // len(chunk))).hexdigest()
    got = hashlib.sha256()
    total = 0
    for part in sbx.files.read("/tmp/big.bin", format="stream"):
        got.update(part)
        total += len(part)
    assert total == size and got.hexdigest() == want
    sbx.files.write("/tmp/big.gz.bin", chunk, gzip=True)
    assert bytes(sbx.files.read("/tmp/big.gz.bin", format="bytes")) == chunk


def test_sync_watch(sbx: Sandbox) -> None:
    sbx.files.make_dir("/tmp/watched")
    handle = sbx.files.watch_dir("/tmp/watched")
    try:
        sbx.files.write("/tmp/watched/new.txt", "1")
        events = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not events:
            events = handle.get_new_events()
            time.sleep(0.05)
        assert any(e.name == "new.txt" and e.type == FilesystemEventType.CREATE for e in events)
    finally:
        handle.stop()


async def test_async_files_and_watch(server: Server) -> None:
    s = await AsyncSandbox.create(timeout=60)
    try:
        await s.files.make_dir("/tmp/w/sub")
        seen: asyncio.Queue[object] = asyncio.Queue()
        handle = await s.files.watch_dir("/tmp/w", seen.put_nowait, recursive=True)
        await s.files.write("/tmp/w/sub/deep.txt", "deep")
        event = await asyncio.wait_for(seen.get(), 10)
        assert "deep.txt" in event.name  # type: ignore[attr-defined]
        await handle.stop()
        assert await s.files.read("/tmp/w/sub/deep.txt") == "deep"
        assert [e.name for e in await s.files.list("/tmp/w/sub")] == ["deep.txt"]
        await s.files.rename("/tmp/w/sub/deep.txt", "/tmp/w/top.txt")
        assert await s.files.exists("/tmp/w/top.txt")
        await s.files.remove("/tmp/w/top.txt")
        assert not await s.files.exists("/tmp/w/top.txt")
    finally:
        await s.kill()


def test_signed_urls_with_plain_httpx(sbx: Sandbox, server: Server) -> None:
    up = sbx.upload_url("/tmp/via-url.txt")
    assert sbx.sandbox_id not in up  # a signed URL names no sandbox: the server finds it
    r = httpx.post(up, files={"file": ("via-url.txt", b"uploaded by url")})
    assert r.status_code == 200, r.text
    assert sbx.files.read("/tmp/via-url.txt") == "uploaded by url"
    down = sbx.download_url("/tmp/via-url.txt", use_signature_expiration=60)
    assert httpx.get(down).content == b"uploaded by url"
    # The signature covers path, operation and expiry: changing any of them is refused.
    # envd's answers, word for word: the signature is judged before its expiry.
    invalid = {"code": 401, "message": "invalid signature"}
    assert httpx.get(down.replace("via-url", "other")).json() == invalid
    assert httpx.post(down, files={"file": ("x", b"x")}).json() == invalid
    expired = sbx.download_url("/tmp/via-url.txt", use_signature_expiration=-10)
    r = httpx.get(expired)
    assert (r.status_code, r.json()) == (
        401,
        {"code": 401, "message": "signature is already expired"},
    )
    forged = expired.replace("signature=v1_", "signature=v1_x")
    assert httpx.get(forged).json() == invalid  # a forger never learns the expiry was the problem


def test_access_token_is_enforced(sbx: Sandbox, server: Server) -> None:
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
    with httpx.Client(base_url=server.url, headers=headers) as c:
        assert c.get("/health").status_code == 204  # envd's health is open
        for token in (None, "wrong"):
            h = {"X-Access-Token": token} if token else {}
            r = c.get("/files", params={"path": "/etc/hostname"}, headers=h)
            assert r.status_code == 401 and r.json()["code"] == 401
            r = c.post("/filesystem.Filesystem/ListDir", json={"path": "/"}, headers=h)
            assert r.status_code == 401
            r = c.post("/files", params={"path": "/tmp/evil"}, content=b"x", headers={
                **h, "Content-Type": "application/octet-stream"})  # fmt: skip
            assert r.status_code == 401
    assert not sbx.files.exists("/tmp/evil")


def test_paths_stay_inside_the_sandbox(sbx: Sandbox, server: Server) -> None:
    before = len(sbx.files.list("/tmp"))
    assert sbx.files.read("/../../../../etc/hostname").strip() == "sandbox"
    assert not sbx.files.exists(str(server.data_dir))  # host paths do not exist in there
    sbx.files.write("../../../tmp/escape-attempt.txt", "x")  # relative to /home/user
    assert sbx.files.exists("/tmp/escape-attempt.txt")
    assert not os.path.exists("/tmp/escape-attempt.txt")  # the host's /tmp is untouched
    sbx.files.remove("/tmp/escape-attempt.txt")
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token or ""}
    r = httpx.get(f"{server.url}/../../../etc/passwd", headers=headers)
    assert r.status_code == 404  # the URL path reaches the agent, not a host file
    sbx.commands.run("echo s3cret > /root/secret; chmod 600 /root/secret", user="root")
    r = httpx.get(f"{server.url}/files?path=/root/secret", headers=headers)
    assert 400 <= r.status_code < 500 and b"s3cret" not in r.content  # file permissions hold
    assert len(sbx.files.list("/tmp")) == before


def test_file_metadata_is_envds(sbx: Sandbox) -> None:
    """Stored as envd's user.e2b.* xattrs: set inside the E2B way it shows; an overwrite without
    metadata drops the old set."""
    info = sbx.files.write("/home/user/meta.txt", "m", metadata={"Kind": "note"})
    assert info.metadata == {"kind": "note"}  # (header names: lowercased, as envd's)
    sbx.commands.run("python3 -c \"import os; os.setxattr('/home/user/meta.txt', "
                     "'user.e2b.origin', b'inside')\"")  # fmt: skip
    assert sbx.files.get_info("/home/user/meta.txt").metadata == {
        "kind": "note",
        "origin": "inside",
    }
    sbx.files.write("/home/user/meta.txt", "n")
    assert not sbx.files.get_info("/home/user/meta.txt").metadata


def test_writing_a_new_file_is_seen_as_envd_reports_it(sbx: Sandbox) -> None:
    """envd's sequence for files.write of a new file (its SDK's own test): CREATE, CHMOD, WRITE."""
    sbx.files.make_dir("/home/user/seq")
    handle = sbx.files.watch_dir("/home/user/seq")
    try:
        sbx.files.write("/home/user/seq/f.txt", "content")
        events: list = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(events) < 3:
            events += handle.get_new_events()
            time.sleep(0.05)
        time.sleep(0.2)
        events += handle.get_new_events()
        assert [(e.name, e.type) for e in events] == [
            ("f.txt", FilesystemEventType.CREATE), ("f.txt", FilesystemEventType.CHMOD),
            ("f.txt", FilesystemEventType.WRITE)]  # fmt: skip
    finally:
        handle.stop()
