"""GET/POST /files over the real agent: both upload forms, gzip, metadata, errors."""

from __future__ import annotations

import gzip
import os
import zlib

from tests.agent.helpers import ok


async def test_octet_stream_upload_and_download(agent):
    target = agent.workdir / "sub" / "dir" / "hello.txt"
    r = await agent.client.post(
        "/files",
        params={"path": str(target)},
        content=b"hello world",
        headers={"Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 200, r.text
    assert r.json() == [{"path": str(target), "name": "hello.txt", "type": "file"}]
    assert target.read_bytes() == b"hello world"
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)

    r = await agent.client.get(
        "/files", params={"path": str(target)}, headers={"Accept-Encoding": "identity"}
    )
    assert r.status_code == 200
    assert r.content == b"hello world"
    assert r.headers["content-disposition"] == 'inline; filename="hello.txt"'
    assert r.headers["vary"] == "Accept-Encoding"
    assert r.headers["content-length"] == "11"
    assert "content-encoding" not in r.headers


async def test_gzip_upload_and_download(agent):
    target = agent.workdir / "gz.bin"
    payload = os.urandom(1000) * 300
    r = await agent.client.post(
        "/files",
        params={"path": str(target)},
        content=gzip.compress(payload),
        headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 200, r.text
    assert target.read_bytes() == payload

    async with agent.client.stream(
        "GET", "/files", params={"path": str(target)}, headers={"Accept-Encoding": "gzip"}
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-encoding"] == "gzip"
        assert r.headers["vary"] == "Accept-Encoding"
        raw = b"".join([chunk async for chunk in r.aiter_raw()])
    assert len(raw) < len(payload)
    assert zlib.decompress(raw, 31) == payload
    r2 = await agent.client.get("/files", params={"path": str(target)})  # default: gzip, deflate
    assert r2.headers["content-encoding"] == "gzip"
    assert r2.content == payload

    r = await agent.client.post(
        "/files",
        params={"path": str(target)},
        content=b"not gzip",
        headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 400


async def test_multipart_several_files(agent):
    a, b = agent.workdir / "m" / "a.txt", agent.workdir / "m" / "deep" / "b.txt"
    files = [("file", (str(a), b"AAA")), ("file", (str(b), b"B" * 100_000))]
    r = await agent.client.post("/files", files=files)
    assert r.status_code == 200, r.text
    assert r.json() == [
        {"path": str(a), "name": "a.txt", "type": "file"},
        {"path": str(b), "name": "b.txt", "type": "file"},
    ]
    assert a.read_bytes() == b"AAA" and b.read_bytes() == b"B" * 100_000

    # a single file: ?path= overrides the part's filename
    c = agent.workdir / "m" / "c.txt"
    r = await agent.client.post(
        "/files", params={"path": str(c)}, files=[("file", ("ignored", b"C"))]
    )
    assert r.json() == [{"path": str(c), "name": "c.txt", "type": "file"}]
    assert c.read_bytes() == b"C"

    # the same path twice in one request is refused
    r = await agent.client.post(
        "/files", files=[("file", (str(a), b"1")), ("file", (str(a), b"2"))]
    )
    assert r.status_code == 400
    assert r.json()["code"] == 400


async def test_multipart_relative_path_and_quotes(agent):
    name = 'odd "name" ü.txt'
    target = agent.workdir / name
    r = await agent.client.post("/files", files=[("file", (str(target), b"x"))])
    assert r.status_code == 200, r.text
    # httpx percent-escapes the quote; Go's mime parser (and we) keep that literally
    assert r.json()[0]["path"] == str(agent.workdir / "odd %22name%22 ü.txt")
    assert (agent.workdir / "odd %22name%22 ü.txt").read_bytes() == b"x"


async def test_metadata(agent):
    target = agent.workdir / "meta.txt"
    r = await agent.client.post(
        "/files",
        params={"path": str(target)},
        content=b"m",
        headers={
            "Content-Type": "application/octet-stream",
            "X-Metadata-Owner": "alice",
            "X-Metadata-purpose": "test run",
        },
    )
    assert r.status_code == 200, r.text
    [info] = r.json()
    assert info["metadata"] == {"owner": "alice", "purpose": "test run"}
    entry = (await ok(agent.client, "filesystem.Filesystem/Stat", {"path": str(target)}))["entry"]
    assert entry["metadata"] == {"owner": "alice", "purpose": "test run"}
    assert os.getxattr(target, "user.e2b.owner") == b"alice"  # envd's names
    os.setxattr(target, "user.e2b.set-inside", b"the e2b way")  # by a process in the sandbox
    entry = (await ok(agent.client, "filesystem.Filesystem/Stat", {"path": str(target)}))["entry"]
    assert entry["metadata"]["set-inside"] == "the e2b way"
    # An overwrite without metadata drops the old set, as envd's does.
    r = await agent.client.post("/files", params={"path": str(target)}, content=b"n",
                                headers={"Content-Type": "application/octet-stream"})  # fmt: skip
    assert r.status_code == 200 and "metadata" not in r.json()[0], r.text
    entry = (await ok(agent.client, "filesystem.Filesystem/Stat", {"path": str(target)}))["entry"]
    assert not entry.get("metadata"), entry

    r = await agent.client.post(
        "/files",
        params={"path": str(target)},
        content=b"m",
        headers={"Content-Type": "application/octet-stream", "X-Metadata-Bad": "\x01"},
    )
    assert r.status_code == 400


async def test_errors(agent):
    r = await agent.client.get("/files", params={"path": str(agent.workdir / "missing")})
    assert r.status_code == 404
    assert r.json() == {"code": 404, "message": f"path '{agent.workdir}/missing' does not exist"}

    r = await agent.client.get("/files", params={"path": str(agent.workdir)})
    assert r.status_code == 400
    assert r.json()["message"] == f"path '{agent.workdir}' is a directory"

    r = await agent.client.get("/files", params={"path": "/etc/hostname", "username": "ghost"})
    assert r.status_code == 401

    r = await agent.client.post(
        "/files", content=b"x", headers={"Content-Type": "application/octet-stream"}
    )
    assert r.status_code == 400 and "path" in r.json()["message"]

    r = await agent.client.post("/files", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 400

    os.mkfifo(agent.workdir / "fifo")
    r = await agent.client.get("/files", params={"path": str(agent.workdir / "fifo")})
    assert r.status_code == 400
    r = await agent.client.post(
        "/files", params={"path": str(agent.workdir / "fifo")}, content=b"x",
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    assert r.status_code == 500  # no reader: refused instead of blocking the agent
    assert (await agent.client.get("/health")).status_code == 204

    r = await agent.client.get("/files", params={"path": "/proc/self/status"})
    assert r.status_code == 200 and b"Pid:" in r.content  # size 0, still read to the end

    (agent.workdir / "isdir").mkdir()
    r = await agent.client.post(
        "/files", params={"path": str(agent.workdir / "isdir")}, content=b"x",
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    assert r.status_code == 400


async def test_upload_as_another_user(agent):
    target = agent.workdir / "nobody" / "file.txt"
    r = await agent.client.post(
        "/files", params={"path": str(target), "username": "nobody"}, content=b"n",
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert target.stat().st_uid == 65534
    assert target.parent.stat().st_uid == 65534  # created parents belong to the user too

    r = await agent.client.post(
        "/files", params={"path": "/root/forbidden.txt", "username": "nobody"}, content=b"n",
        headers={"Content-Type": "application/octet-stream"},
    )  # fmt: skip
    assert r.status_code == 403
    assert not os.path.exists("/root/forbidden.txt")

    secret = agent.workdir / "secret"
    secret.write_text("s")
    os.chmod(secret, 0o600)
    r = await agent.client.get("/files", params={"path": str(secret), "username": "nobody"})
    assert r.status_code == 403


async def test_large_streamed_upload_keeps_agent_memory_low(agent):
    target = agent.workdir / "big.bin"
    chunk = os.urandom(1 << 20)

    async def body():
        for _ in range(200):
            yield chunk

    r = await agent.client.post(
        "/files", params={"path": str(target)}, content=body(),
        headers={"Content-Type": "application/octet-stream"}, timeout=120,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert target.stat().st_size == 200 << 20
    with open(f"/proc/{agent.pid}/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    assert hwm < 64 * 1024, f"agent peak RSS {hwm} KiB"
    r = await agent.client.get(
        "/files", params={"path": str(target)}, headers={"Accept-Encoding": "identity"}
    )
    assert len(r.content) == 200 << 20
