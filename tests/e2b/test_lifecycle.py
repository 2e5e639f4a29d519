"""Timeouts, auto-pause, auto-resume and a server restart, as E2B defines them.

No timing asserts: each test waits (bounded) for the state the lifecycle must reach.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from e2b import (
    AsyncSandbox,
    Sandbox,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
)
from e2b.sandbox.sandbox_api import SandboxLifecycle

from tests.support.e2b_server import KEY_A, Server, new_server


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.25)


async def gone(s: AsyncSandbox) -> bool:
    return not await s.is_running()


async def state_is(s: AsyncSandbox, state: SandboxState) -> bool:
    return (await s.get_info()).state == state


async def kill_on_timeout() -> None:
    s = await AsyncSandbox.create(timeout=5)
    assert await s.is_running()
    await eventually(lambda: gone(s))
    with pytest.raises(SandboxNotFoundException):
        await s.get_info()
    pager = AsyncSandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING]))
    assert s.sandbox_id not in [x.sandbox_id for x in await pager.next_items()]


async def shortened_by_set_timeout() -> None:
    s = await AsyncSandbox.create(timeout=300)
    await s.set_timeout(2)
    await eventually(lambda: gone(s))
    assert await AsyncSandbox.kill(s.sandbox_id) is False


async def auto_pause_then_auto_resume() -> None:
    lifecycle: SandboxLifecycle = {"on_timeout": "pause", "auto_resume": True}
    s = await AsyncSandbox.create(timeout=4, metadata={"stage": "one"}, lifecycle=lifecycle)
    await s.files.write("/home/user/kept.txt", "kept")
    await eventually(lambda: state_is(s, SandboxState.PAUSED))
    info = await s.get_info()
    assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}
    # Any data-plane request wakes it up before being served.
    assert (await s.commands.run("cat kept.txt")).stdout == "kept"
    info = await s.get_info()
    assert info.state == SandboxState.RUNNING and info.metadata == {"stage": "one"}
    # Resumed with the create timeout, floored at the server's minimum (60 s by default).
    assert (info.end_at - datetime.now(UTC)).total_seconds() > 30
    assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}  # kept across cycles
    await s.kill()


async def auto_pause_without_auto_resume() -> None:
    s = await AsyncSandbox.create(timeout=3, lifecycle={"on_timeout": "pause"})
    await eventually(lambda: state_is(s, SandboxState.PAUSED))
    assert not await s.is_running()  # 502 "was not found", and it stays paused
    with pytest.raises(SandboxNotRunningException):
        await s.commands.run("true")
    assert (await s.get_info()).state == SandboxState.PAUSED
    resumed = await AsyncSandbox.connect(s.sandbox_id, timeout=60)
    assert (await resumed.commands.run("echo up")).stdout == "up\n"
    await resumed.kill()


async def test_timeouts_pause_and_resume(server: Server) -> None:
    await asyncio.gather(
        kill_on_timeout(),
        shortened_by_set_timeout(),
        auto_pause_then_auto_resume(),
        auto_pause_without_auto_resume(),
    )


def test_restart_keeps_sandboxes_and_timers(tmp_path: Path) -> None:
    srv = new_server(tmp_path)
    opts = {"api_url": srv.url, "sandbox_url": srv.url, "api_key": KEY_A}
    srv.start()
    try:
        # Long enough to still be alive when the server stops, even on a loaded machine.
        doomed = Sandbox.create(timeout=10, **opts)
        sleeper = Sandbox.create(timeout=10, lifecycle={"on_timeout": "pause"}, **opts)
        keeper = Sandbox.create(timeout=600, metadata={"role": "keeper"}, **opts)
        parked = Sandbox.create(timeout=600, metadata={"role": "parked"}, **opts)
        keeper.files.write("/home/user/note.txt", "survives")
        worker = keeper.commands.run("sleep 900", background=True)
        end_at = keeper.get_info().end_at
        due = max(doomed.get_info().end_at, sleeper.get_info().end_at)
        parked.pause()
        srv.stop()
        # Server down: the sandboxes keep running, and two of them fall due meanwhile.
        assert len(srv.runtime().list()) == 4
        time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 1)
        srv.start()

        # Handled by the first lifecycle tick after start, from the records on disk.
        def settled() -> bool:
            paused = Sandbox.get_info(sleeper.sandbox_id, **opts).state == SandboxState.PAUSED
            alive = doomed.sandbox_id in [s.sandbox_id for s in Sandbox.list(**opts).next_items()]
            return paused and not alive

        deadline = time.monotonic() + 30
        while not settled():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(doomed.sandbox_id, **opts)
        info = Sandbox.get_info(keeper.sandbox_id, **opts)
        assert info.state == SandboxState.RUNNING and info.end_at == end_at
        assert info.metadata == {"role": "keeper"}
        again = Sandbox.connect(keeper.sandbox_id, **opts)
        assert again.files.read("/home/user/note.txt") == "survives"
        assert worker.pid in [p.pid for p in again.commands.list()]
        parked_info = Sandbox.get_info(parked.sandbox_id, **opts)
        assert parked_info.state == SandboxState.PAUSED
        assert parked_info.metadata == {"role": "parked"}
        assert Sandbox.connect(parked.sandbox_id, **opts).commands.run("echo ok").stdout == "ok\n"
    finally:
        srv.destroy()
