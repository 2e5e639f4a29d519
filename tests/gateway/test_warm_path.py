"""A warm tool call's short path (a gateway in this process, the ``local`` provider, a real
store): the call's timeline row and the end of its use are in the store when it answers, the
keep-alive is restored right after (and left alone while the sandbox already ends within its
slack), the agent's connection is pooled, and a sandbox whose agent died while the provider
still knew it running is found out on the next call, which gets a new sandbox."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from sandhold.config import Settings
from sandhold.errors import SandboxGone
from sandhold.gateway.app import Gateway
from sandhold.gateway.keep_alive import KEEP_ALIVE_SLACK
from sandhold.gateway.providers.base import ProviderError
from sandhold.gateway.providers.local import LocalProvider
from sandhold.store.db import Store
from sandhold.store.models import SessionUse
from tests.support.gateway_server import destroy_runtime_dir, scratch_dir

KEEP_ALIVE = 300  # its slack: 3 s
SLACK = int(KEEP_ALIVE * KEEP_ALIVE_SLACK)


def settings_for(data_dir: Path, workspace_root: Path, **policy: Any) -> Settings:
    return Settings(
        data_dir=data_dir, gateway_workspace_root=workspace_root / data_dir.name,
        gateway_tenants={"acme": {"api_key": "k" * 20, "policy": {"retention_s": 3600, **policy}}},
        gateway_reclaim_interval_s=3600, prebuild_templates=[],
    )  # fmt: skip


async def run_command(gw: Gateway, session: str, command: str = "true") -> dict[str, Any]:
    return await gw.tools.call("acme", "run_command", {"command": command}, session)


async def settled(gw: Gateway) -> None:
    """Wait for the keep-alives being restored in the background."""
    while gw.manager.keep_alive.pending:
        await gw.manager.keep_alive.stop()


def uses(store: Store) -> int:
    with store.db() as db:
        return db.query(SessionUse).count()


def test_a_call_answers_with_its_row_written_and_its_keep_alive_restored_after(
    workspace_root: Path,
) -> None:
    data_dir = scratch_dir("sandhold-gw-warm-")

    async def scenario() -> None:
        gw = Gateway(settings_for(data_dir, workspace_root, keep_alive_s=KEEP_ALIVE))
        async with gw.running(reclaim=False):
            assert isinstance(gw.provider, LocalProvider)
            await run_command(gw, "s1")  # the create
            await settled(gw)
            tool_calls = len(gw.store.events("tool_call"))
            t0 = time.time()
            out = await run_command(gw, "s1", "echo warm")
            # Answered: its row is durable and its use gone, whatever the background does.
            assert out["stdout"] == "warm\n"
            assert len(gw.store.events("tool_call")) == tool_calls + 1
            assert uses(gw.store) == 0
            await settled(gw)
            row = await gw.manager.session("acme", "s1")
            assert row.lock_owner is None
            sbx = await gw.provider.get(row.sandbox_id or "")
            assert sbx is not None and sbx.state == "running" and sbx.end_at is not None
            # idle from the call's end: a keep-alive, up to its slack longer; never shorter
            assert t0 + KEEP_ALIVE - 1 <= sbx.end_at <= time.time() + KEEP_ALIVE + SLACK + 1
            # Calls in a row within the slack: no provider write (the end stays as it was).
            for _ in range(3):
                await run_command(gw, "s1")
                await settled(gw)
            again = await gw.provider.get(row.sandbox_id or "")
            assert again is not None and again.end_at == sbx.end_at
            # Once it would end sooner than a keep-alive from now, it is set again.
            await gw.provider.set_timeout(row.sandbox_id or "", KEEP_ALIVE - 10)
            await run_command(gw, "s1")
            await settled(gw)
            moved = await gw.provider.get(row.sandbox_id or "")
            assert moved is not None and moved.end_at is not None
            assert moved.end_at >= time.time() + KEEP_ALIVE - 1
            # one pooled client for the sandbox's agent, served every call
            assert len(gw.provider.channels) == 1
            await gw.manager.close("acme", "s1")
            assert len(gw.provider.channels) == 0  # dropped with its sandbox

    try:
        asyncio.run(scenario())
    finally:
        assert not destroy_runtime_dir(data_dir)


def test_a_short_keep_alive_still_pauses_after_a_call_that_extended_it(
    workspace_root: Path,
) -> None:
    """A call's budget outlasts a 1 s keep-alive: the call extends the sandbox's end for its
    run, and its end sets the keep-alive back (the slack never keeps the longer end)."""
    data_dir = scratch_dir("sandhold-gw-warm-")

    async def scenario() -> None:
        gw = Gateway(settings_for(data_dir, workspace_root, keep_alive_s=1))
        async with gw.running(reclaim=False):
            await run_command(gw, "s2")
            await run_command(gw, "s2")
            await settled(gw)
            row = await gw.manager.session("acme", "s2")
            deadline = time.monotonic() + 30
            while (sbx := await gw.provider.get(row.sandbox_id or "")) and sbx.state != "paused":
                assert time.monotonic() < deadline, sbx
                await asyncio.sleep(0.1)
            # the next call resumes it (the provider knew it no longer ran)
            assert (await run_command(gw, "s2", "echo back"))["stdout"] == "back\n"
            kinds = [e.kind for e in gw.store.timeline("acme", "s2")]
            assert kinds.count("sandbox_resumed") == 1 and "sandbox_paused" in kinds
            await gw.manager.close("acme", "s2")  # killed (and reaped) by its own runtime

    try:
        asyncio.run(scenario())
    finally:
        assert not destroy_runtime_dir(data_dir)


def test_an_agent_dead_behind_a_pooled_connection_gets_the_session_a_new_sandbox(
    workspace_root: Path,
) -> None:
    data_dir = scratch_dir("sandhold-gw-warm-")

    async def scenario() -> None:
        gw = Gateway(settings_for(data_dir, workspace_root, keep_alive_s=KEEP_ALIVE))
        async with gw.running(reclaim=False):
            assert isinstance(gw.provider, LocalProvider)
            await run_command(gw, "s3", "echo kept > /workspace/kept.txt")
            await settled(gw)
            first = (await gw.manager.session("acme", "s3")).sandbox_id or ""
            assert gw.provider.known_running_for(first) > 60
            os.kill(gw.provider.runtime.get(first).init_pid, signal.SIGKILL)  # a bug, say
            # Dead while idle (asked of the runtime: the provider still holds it running).
            deadline = time.monotonic() + 30
            while gw.provider.runtime.get(first).state != "failed":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert gw.provider.known_running_for(first) > 60
            out = await run_command(gw, "s3", "cat /workspace/kept.txt")
            assert out["stdout"] == "kept\n"  # same workspace, a new sandbox
            second = (await gw.manager.session("acme", "s3")).sandbox_id
            assert second and second != first
            kinds = [e.kind for e in gw.store.timeline("acme", "s3")]
            assert "sandbox_failed" in kinds and kinds.count("sandbox_created") == 2
            assert await gw.provider.get(first) is None  # the failed one was killed
            # Killed just before a call (the request may meet the agent dying): at most that
            # call fails, and the next one gets a new sandbox.
            await settled(gw)
            os.kill(gw.provider.runtime.get(second).init_pid, signal.SIGKILL)
            try:
                await run_command(gw, "s3")
            except (ProviderError, SandboxGone):
                pass
            # (no wait: while the kernel ends the killed agent, its cgroup still lists it and
            # its socket refuses; the runtime sees it ending, so this call is not refused too)
            assert (await run_command(gw, "s3", "cat /workspace/kept.txt"))["stdout"] == "kept\n"
            third = (await gw.manager.session("acme", "s3")).sandbox_id
            assert third not in (first, second)
            await gw.manager.close("acme", "s3")

    try:
        asyncio.run(scenario())
    finally:
        assert not destroy_runtime_dir(data_dir)


def test_the_call_statements_keep_the_lock_and_use_rules(store: Store) -> None:
    """The store side of a call (one statement at a time on PostgreSQL): its use is there when
    the lock is free again; the keep-alive's lock is taken only when free and reads the uses
    in flight; the call's end writes its rows, then drops its use and expired ones (debris of
    a replica that died mid-call)."""
    row, token, created = store.open_and_lock("acme", "c1", 30)
    assert created and token is not None
    assert store.open_and_lock("acme", "c1", 30)[1] is None  # held
    assert store.set_sandbox(row.pk, token, "sbx-1", {"network": {}})
    use = store.add_use_and_unlock(row.pk, token, "sbx-1", "r", "run_command", 90)
    keep, live = store.lock_for_keep_alive(row.pk, 30)
    assert keep is not None and len(live) == 1 and live[0] > time.time() + 60
    assert store.lock_for_keep_alive(row.pk, 30) == (None, [])  # held: no waiting
    assert store.open_and_lock("acme", "c1", 30)[1] is None
    store.unlock(row.pk, keep)
    with store.engine.begin() as conn:
        conn.execute(SessionUse.__table__.insert(), [{
            "id": "stale", "session_pk": row.pk, "sandbox_id": "sbx-1", "replica": "gone",
            "tool": "run_command", "started_at": 0.0, "expires_at": 1.0}])  # fmt: skip
    event = {"at": time.time(), "tenant_id": "acme", "session_id": "c1", "kind": "tool_call",
             "tool": "run_command", "exit_code": 0,
             "provider_state": {"state": "running"}}  # fmt: skip
    store.end_use(use, row.pk, [event])
    [written] = store.events("tool_call")
    assert (written.exit_code, written.provider_state, written.error) == (
        0, {"state": "running"}, None)  # fmt: skip
    assert uses(store) == 0
    keep, live = store.lock_for_keep_alive(row.pk, 30)
    assert keep is not None and live == []
    store.unlock(row.pk, keep)
    after = store.get_session("acme", "c1")
    assert after is not None and after.lock_owner is None and after.sandbox_id == "sbx-1"
