"""The agent driven by the official e2b SDK's own envd clients (commands, PTY, filesystem).

The SDK speaks TCP, so a tiny forwarder bridges 127.0.0.1 to the agent's unix socket. Commands
run as ``nobody`` in /tmp: the SDK always starts login shells, and root's login shell on a
host runs whatever the host profile does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from e2b.api.client_async import get_envd_api
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import FileNotFoundException
from e2b.sandbox.commands.command_handle import CommandExitException, PtySize
from e2b.sandbox.filesystem.filesystem import FileType
from e2b.sandbox_async.commands.command import Commands
from e2b.sandbox_async.commands.pty import Pty
from e2b.sandbox_async.filesystem.filesystem import Filesystem
from packaging.version import Version

ENVD = Version("0.6.13")


@contextlib.asynccontextmanager
async def tcp_bridge(socket_path: str) -> AsyncIterator[str]:
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def on_client(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_unix_connection(socket_path)
        await asyncio.gather(pipe(cr, uw), pipe(ur, cw))

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


@pytest.fixture
async def sdk(agent, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    async with tcp_bridge(agent.socket_path) as url:
        config = ConnectionConfig(api_key="test", sandbox_url=url, request_timeout=30)
        envd_api = get_envd_api(config, url)
        yield (
            Commands(url, config, ENVD, envd_api),
            Filesystem(url, ENVD, config, envd_api),
            Pty(url, config, ENVD, envd_api),
        )
        await envd_api.aclose()


async def test_sdk_commands(sdk, agent):
    commands, _, _ = sdk
    result = await commands.run("echo hello; echo oops >&2", user="nobody", cwd="/tmp")
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "oops\n", 0)

    with pytest.raises(CommandExitException) as exc:
        await commands.run("exit 7", user="nobody", cwd="/tmp")
    assert exc.value.exit_code == 7

    handle = await commands.run(
        "read x; echo got $x", background=True, stdin=True, user="nobody", cwd="/tmp"
    )
    assert [p.pid for p in await commands.list()] == [handle.pid]
    await commands.send_stdin(handle.pid, "abc\n")
    result = await handle.wait()
    assert result.stdout == "got abc\n"

    handle = await commands.run("sleep 30", background=True, user="nobody", cwd="/tmp")
    assert await commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as exc:
        await handle.wait()
    assert exc.value.exit_code == -1
    assert await commands.kill(999999) is False

    handle = await commands.run("sleep 0.5; echo late", background=True, user="nobody", cwd="/tmp")
    again = await commands.connect(handle.pid)
    assert (await again.wait()).stdout == "late\n"


async def test_sdk_pty(sdk):
    _, _, pty = sdk
    chunks: list[bytes] = []
    handle = await pty.create(
        PtySize(rows=24, cols=80), on_data=chunks.append, user="nobody", cwd="/tmp"
    )
    await pty.send_stdin(handle.pid, b"stty size; exit\n")
    result = await handle.wait()
    assert result.exit_code == 0
    assert b"24 80" in b"".join(chunks)


async def test_sdk_filesystem(sdk, agent):
    _, files, _ = sdk
    base = str(agent.workdir / "sdk")
    info = await files.write(f"{base}/a.txt", "hello", metadata={"kind": "greeting"})
    assert info.path == f"{base}/a.txt" and info.metadata == {"kind": "greeting"}
    assert await files.read(f"{base}/a.txt") == "hello"
    infos = await files.write_files(
        [{"path": f"{base}/b.txt", "data": b"B"}, {"path": f"{base}/c/d.txt", "data": "D"}]
    )
    assert [i.name for i in infos] == ["b.txt", "d.txt"]
    await files.write(f"{base}/gz.txt", "zipped" * 100, gzip=True)
    assert await files.read(f"{base}/gz.txt", gzip=True) == "zipped" * 100

    entries = await files.list(base)
    assert [(e.name, e.type) for e in entries] == [
        ("a.txt", FileType.FILE), ("b.txt", FileType.FILE), ("c", FileType.DIR),
        ("gz.txt", FileType.FILE),
    ]  # fmt: skip
    entry = await files.get_info(f"{base}/a.txt")
    assert entry.size == 5 and entry.owner == "root" and entry.metadata == {"kind": "greeting"}
    assert await files.exists(f"{base}/a.txt") is True
    assert await files.exists(f"{base}/nope") is False
    assert await files.make_dir(f"{base}/new/dir") is True
    assert await files.make_dir(f"{base}/new/dir") is False
    moved = await files.rename(f"{base}/b.txt", f"{base}/new/b.txt")
    assert moved.path == f"{base}/new/b.txt"
    await files.remove(f"{base}/new")
    assert await files.exists(f"{base}/new") is False
    with pytest.raises(FileNotFoundException):
        await files.read(f"{base}/nope")

    events = []
    got_remove = asyncio.Event()

    def on_event(ev):
        events.append(ev)
        if ev.type.value == "remove":
            got_remove.set()

    watch = await files.watch_dir(base, on_event, recursive=True)
    await files.write(f"{base}/c/w.txt", "w")
    await files.remove(f"{base}/c/w.txt")
    await asyncio.wait_for(got_remove.wait(), 10)
    await watch.stop()
    assert ("c/w.txt", "create") in [(e.name, e.type.value) for e in events]
