"""filesystem.Filesystem over the real agent: entries, dirs, moves, listing, removal, watchers."""

from __future__ import annotations

import asyncio
import os
import re
import uuid

from tests.agent.helpers import END_STREAM, ok, open_stream, unary

FS = "filesystem.Filesystem"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3}|\.\d{6}|\.\d{9})?Z$")


async def test_stat_file_dir_and_symlink(agent):
    f = agent.workdir / "a.txt"
    f.write_text("hello")
    os.chmod(f, 0o640)
    (agent.workdir / "d").mkdir()
    (agent.workdir / "link").symlink_to(f)
    (agent.workdir / "dangling").symlink_to(agent.workdir / "nowhere")

    entry = (await ok(agent.client, f"{FS}/Stat", {"path": str(f)}))["entry"]
    mtime = entry.pop("modifiedTime")
    assert RFC3339.match(mtime), mtime
    assert entry == {
        "name": "a.txt",
        "type": "FILE_TYPE_FILE",
        "path": str(f),
        "size": "5",
        "mode": 0o640,
        "permissions": "-rw-r-----",
        "owner": "root",
        "group": "root",
    }
    d = (await ok(agent.client, f"{FS}/Stat", {"path": str(agent.workdir / "d")}))["entry"]
    assert d["type"] == "FILE_TYPE_DIRECTORY" and d["permissions"].startswith("d")

    link = (await ok(agent.client, f"{FS}/Stat", {"path": str(agent.workdir / "link")}))["entry"]
    assert link["type"] == "FILE_TYPE_FILE"  # the target's type, as E2B's envd says it
    assert "isSymlink" not in link  # (which E2B's envd never sends)
    assert link["symlinkTarget"] == str(f)
    assert link["mode"] == 0o640
    assert link["permissions"] == "Lrwxrwxrwx"

    dangling = await ok(agent.client, f"{FS}/Stat", {"path": str(agent.workdir / "dangling")})
    assert dangling["entry"]["type"] == "FILE_TYPE_SYMLINK"  # (no target to name)

    status, body = await unary(agent.client, f"{FS}/Stat", {"path": str(agent.workdir / "nope")})
    assert status == 404 and body["code"] == "not_found"
    assert "file not found" in body["message"]


async def test_relative_paths_resolve_against_home(agent):
    name = f"sandhold-agent-test-{uuid.uuid4().hex}"
    try:
        entry = (await ok(agent.client, f"{FS}/MakeDir", {"path": name}))["entry"]
        assert entry["path"] == f"/root/{name}"
        entry = (await ok(agent.client, f"{FS}/Stat", {"path": f"~/{name}/../{name}"}))["entry"]
        assert entry["path"] == f"/root/{name}"
    finally:
        await ok(agent.client, f"{FS}/Remove", {"path": f"/root/{name}"})
    assert not os.path.exists(f"/root/{name}")


async def test_make_dir(agent):
    target = agent.workdir / "x" / "y" / "z"
    entry = (await ok(agent.client, f"{FS}/MakeDir", {"path": str(target)}))["entry"]
    assert entry["name"] == "z" and entry["type"] == "FILE_TYPE_DIRECTORY"
    assert target.is_dir()
    assert oct(target.stat().st_mode & 0o777) == oct(0o755)

    status, body = await unary(agent.client, f"{FS}/MakeDir", {"path": str(target)})
    assert (status, body["code"]) == (409, "already_exists")
    assert body["message"] == f"directory already exists: {target}"

    (agent.workdir / "file").write_text("")
    status, body = await unary(agent.client, f"{FS}/MakeDir", {"path": str(agent.workdir / "file")})
    assert (status, body["code"]) == (400, "invalid_argument")


async def test_move(agent):
    src = agent.workdir / "src.txt"
    src.write_text("data")
    dst = agent.workdir / "new" / "dir" / "dst.txt"
    entry = await ok(agent.client, f"{FS}/Move", {"source": str(src), "destination": str(dst)})
    assert entry["entry"]["path"] == str(dst) and entry["entry"]["size"] == "4"
    assert dst.read_text() == "data" and not src.exists()

    status, body = await unary(
        agent.client, f"{FS}/Move", {"source": str(src), "destination": str(dst)}
    )
    assert (status, body["code"]) == (404, "not_found")


async def test_list_dir_depth(agent):
    root = agent.workdir / "tree"
    (root / "b" / "c").mkdir(parents=True)
    (root / "a.txt").write_text("1")
    (root / "b" / "b1.txt").write_text("22")
    (root / "b" / "c" / "deep.txt").write_text("333")
    (root / "lnk").symlink_to(root / "b")

    async def paths(depth: int, path: str = str(root)) -> list[str]:
        res = await ok(agent.client, f"{FS}/ListDir", {"path": path, "depth": depth})
        return [e["path"] for e in res["entries"]]

    one = [f"{root}/a.txt", f"{root}/b", f"{root}/lnk"]
    assert await paths(0) == one  # 0 means 1, like envd
    assert await paths(1) == one
    assert await paths(2) == [
        f"{root}/a.txt", f"{root}/b", f"{root}/b/b1.txt", f"{root}/b/c", f"{root}/lnk",
    ]  # fmt: skip
    assert len(await paths(3)) == 6
    # listing through a symlink reports paths under the requested path
    assert await paths(1, str(root / "lnk")) == [f"{root}/lnk/b1.txt", f"{root}/lnk/c"]

    res = await ok(agent.client, f"{FS}/ListDir", {"path": str(root)})
    lnk = next(e for e in res["entries"] if e["name"] == "lnk")
    assert lnk["type"] == "FILE_TYPE_DIRECTORY" and lnk["symlinkTarget"] == str(root / "b")

    status, body = await unary(agent.client, f"{FS}/ListDir", {"path": str(root / "a.txt")})
    assert (status, body["code"]) == (400, "invalid_argument")
    status, body = await unary(agent.client, f"{FS}/ListDir", {"path": str(root / "missing")})
    assert (status, body["code"]) == (404, "not_found")


async def test_remove(agent):
    root = agent.workdir / "rm"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    await ok(agent.client, f"{FS}/Remove", {"path": str(root)})
    assert not root.exists()
    await ok(agent.client, f"{FS}/Remove", {"path": str(root)})  # already gone: fine


async def test_permissions_follow_the_user(agent):
    private = agent.workdir / "private"
    private.mkdir(mode=0o700)
    status, body = await unary(
        agent.client, f"{FS}/MakeDir", {"path": str(private / "x")}, user="nobody"
    )
    assert (status, body["code"]) == (403, "permission_denied")
    status, body = await unary(agent.client, f"{FS}/ListDir", {"path": str(private)}, user="nobody")
    assert (status, body["code"]) == (403, "permission_denied")

    entry = await ok(
        agent.client, f"{FS}/MakeDir", {"path": str(agent.workdir / "mine")}, user="nobody"
    )
    assert entry["entry"]["owner"] == "nobody"
    assert (agent.workdir / "mine").stat().st_uid == 65534


async def _collect_watch(agent, body, action, until, headers=None):
    """Run a WatchDir stream, do ``action`` once started, collect events until ``until``."""
    events: list[dict] = []
    kinds: list[str] = []

    async def consume():
        async for flags, msg in open_stream(agent.client, f"{FS}/WatchDir", body, headers=headers):
            assert not flags & END_STREAM, msg
            kind = next(iter(msg))
            kinds.append(kind)
            if kind == "start":
                asyncio.get_running_loop().call_soon(action)
            elif kind == "filesystem":
                events.append(msg["filesystem"])
                if until(events):
                    return

    await asyncio.wait_for(consume(), 10)
    return kinds, events


async def test_watch_dir_stream(agent):
    root = agent.workdir / "watched"
    root.mkdir()
    f = root / "file.txt"

    def action():
        f.write_text("hello")
        f.unlink()

    kinds, events = await _collect_watch(
        agent, {"path": str(root)}, action, lambda evs: evs[-1]["type"] == "EVENT_TYPE_REMOVE"
    )
    assert kinds[0] == "start"
    assert [(e["name"], e["type"]) for e in events] == [
        ("file.txt", "EVENT_TYPE_CREATE"),
        ("file.txt", "EVENT_TYPE_WRITE"),
        ("file.txt", "EVENT_TYPE_REMOVE"),
    ]


async def test_watch_dir_recursive_with_entries(agent):
    root = agent.workdir / "rwatched"
    (root / "sub").mkdir(parents=True)

    def action():
        (root / "sub" / "inner.txt").write_text("x")
        (root / "sub" / "new").mkdir()

    def done(evs):
        return any(e["name"] == "sub/new" for e in evs)

    _, events = await _collect_watch(
        agent, {"path": str(root), "recursive": True, "includeEntry": True}, action, done
    )
    create = next(e for e in events if e["name"] == "sub/inner.txt")
    assert create["type"] == "EVENT_TYPE_CREATE"
    assert create["entry"]["path"] == str(root / "sub" / "inner.txt")
    assert create["entry"]["type"] == "FILE_TYPE_FILE"
    newdir = next(e for e in events if e["name"] == "sub/new")
    assert newdir["entry"]["type"] == "FILE_TYPE_DIRECTORY"


async def test_watch_dir_keepalive_and_errors(agent):
    root = agent.workdir / "quiet"
    root.mkdir()
    kinds: list[str] = []

    async def consume():
        async for _flags, msg in open_stream(
            agent.client, f"{FS}/WatchDir", {"path": str(root)},
            headers={"Keepalive-Ping-Interval": "1"},
        ):  # fmt: skip
            kinds.append(next(iter(msg)))
            if kinds.count("keepalive") == 2:
                return

    await asyncio.wait_for(consume(), 10)
    assert kinds == ["start", "keepalive", "keepalive"]

    async for flags, msg in open_stream(agent.client, f"{FS}/WatchDir", {"path": str(root / "no")}):
        assert flags == END_STREAM
        assert msg["error"]["code"] == "not_found"


async def test_polled_watcher(agent):
    root = agent.workdir / "polled"
    root.mkdir()
    created = await ok(agent.client, f"{FS}/CreateWatcher", {"path": str(root)})
    wid = created["watcherId"]
    assert wid.startswith("w")
    (root / "one").write_text("1")
    (root / "one").unlink()
    events: list[dict] = []
    for _ in range(50):
        events += (await ok(agent.client, f"{FS}/GetWatcherEvents", {"watcherId": wid}))["events"]
        if any(e["type"] == "EVENT_TYPE_REMOVE" for e in events):
            break
        await asyncio.sleep(0.05)
    assert [e["type"] for e in events] == [
        "EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE", "EVENT_TYPE_REMOVE",
    ]  # fmt: skip
    again = await ok(agent.client, f"{FS}/GetWatcherEvents", {"watcherId": wid})
    assert again == {"events": []}
    await ok(agent.client, f"{FS}/RemoveWatcher", {"watcherId": wid})
    status, body = await unary(agent.client, f"{FS}/GetWatcherEvents", {"watcherId": wid})
    assert (status, body["code"]) == (404, "not_found")
