"""A warm call's one statement (``Store.use_if_free``, ``SandboxSessionManager._use_warm``): a
use is registered only while the session's lock is free, the session open and its sandbox the
one the replica knows running, with nobody able to take the lock in between; whoever takes the
lock next (the reclaimer, a keep-alive) sees the use. Anything else falls back to taking the
lock. On both stores; the race with a lock taken meanwhile on PostgreSQL's row locks."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import update

from sandhold.gateway.app import Gateway
from sandhold.store.db import Store
from sandhold.store.models import Session, SessionUse
from tests.gateway.test_warm_path import run_command, settings_for, settled
from tests.support.gateway_server import destroy_runtime_dir, scratch_dir


def uses(store: Store) -> list[str]:
    with store.db() as db:
        return [u.id for u in db.query(SessionUse)]


def session_with_sandbox(store: Store, name: str = "c1") -> int:
    row, token, _ = store.open_and_lock("acme", name, 30)
    assert token is not None and store.set_sandbox(row.pk, token, "sbx-1", {"network": {}})
    store.unlock(row.pk, token)
    return row.pk


def test_a_use_is_registered_only_on_a_free_open_session_with_that_sandbox(store: Store) -> None:
    pk = session_with_sandbox(store)
    got = store.use_if_free("acme", "c1", "sbx-1", "r1", "run_command", 90)
    assert got is not None
    row, use_id = got
    assert (row.pk, row.sandbox_id, row.sandbox_handle, row.lock_owner) == (
        pk, "sbx-1", {"network": {}}, None)  # fmt: skip
    assert uses(store) == [use_id]
    # The next holders of the lock see it: a reclaim skips the session, a keep-alive counts it.
    _token, outcome = store.lock_for_reclaim({pk: "sbx-1"}, 30)
    assert outcome == {pk: "in_use"}
    keep, live = store.lock_for_keep_alive(pk, 30)
    assert keep is not None and len(live) == 1
    # Held lock, another sandbox, an unknown session: nothing registered.
    assert store.use_if_free("acme", "c1", "sbx-1", "r1", "run_command", 90) is None
    store.unlock(pk, keep)
    assert store.use_if_free("acme", "c1", "sbx-2", "r1", "run_command", 90) is None
    assert store.use_if_free("acme", "nope", "sbx-1", "r1", "run_command", 90) is None
    assert store.use_if_free("globex", "c1", "sbx-1", "r1", "run_command", 90) is None
    assert uses(store) == [use_id]
    store.end_use(use_id, pk)
    # An expired lock counts as free (its holder died); a closed session never.
    with store.engine.begin() as conn:
        conn.execute(update(Session).where(Session.id == pk).values(
            lock_owner="dead", lock_until=time.time() - 1))  # fmt: skip
    got = store.use_if_free("acme", "c1", "sbx-1", "r1", "run_command", 90)
    assert got is not None and got[0].lock_owner == "dead"
    store.end_use(got[1], pk)
    keep = store.try_lock(pk, 30)
    assert keep is not None and store.mark_closed(pk, keep)
    assert store.use_if_free("acme", "c1", "sbx-1", "r1", "run_command", 90) is None
    assert uses(store) == []


def test_a_lock_taken_while_the_statement_waits_wins(store: Store) -> None:
    """Someone takes the session's lock in a transaction still open (the reclaimer's batch): the
    warm statement waits for it (PostgreSQL: the row lock; SQLite: the write lock) and then,
    seeing the lock taken, registers nothing."""
    pk = session_with_sandbox(store)
    result: list[Any] = []
    with store.engine.begin() as conn:
        conn.execute(update(Session).where(Session.id == pk).values(
            lock_owner="reclaimer", lock_until=time.time() + 30))  # fmt: skip
        t = threading.Thread(target=lambda: result.append(
            store.use_if_free("acme", "c1", "sbx-1", "r1", "run_command", 90)))  # fmt: skip
        t.start()
        t.join(0.5)
        assert t.is_alive()  # waiting for the transaction
    t.join(30)
    assert result == [None] and uses(store) == []


def test_warm_calls_take_no_lock_and_a_changed_session_takes_it_again(
    store: Store, workspace_root: Path
) -> None:
    """Through the gateway (local provider): warm calls register their use in one statement;
    when another replica gave the session another sandbox, the call finds out under the lock
    and uses that one."""
    data_dir = scratch_dir("sandhold-gw-warmuse-")

    async def scenario() -> None:
        settings = settings_for(data_dir, workspace_root, keep_alive_s=300)
        settings.gateway_store_url = store.url
        gw = Gateway(settings)
        async with gw.running(reclaim=False):
            locks: list[str] = []
            real = gw.store.open_and_lock

            def counted(*args: Any) -> Any:
                locks.append(args[1])
                return real(*args)

            gw.store.open_and_lock = counted  # type: ignore[method-assign]
            await run_command(gw, "w1")  # the create, under the lock
            await settled(gw)
            for _ in range(3):
                assert (await run_command(gw, "w1", "echo warm"))["stdout"] == "warm\n"
                await settled(gw)
            assert locks == ["w1"]
            assert uses(gw.store) == []
            first = (await gw.manager.session("acme", "w1")).sandbox_id
            # Another replica's doing: the session has a new sandbox (the old one is killed).
            await run_command(gw, "w2")
            w2 = (await gw.manager.session("acme", "w2")).sandbox_id
            row = await gw.manager.session("acme", "w1")
            token = gw.store.try_lock(row.pk, 30)
            assert token is not None and gw.store.set_sandbox(row.pk, token, w2, {})
            gw.store.unlock(row.pk, token)
            await gw.provider.kill(first or "")
            out = await run_command(gw, "w1", "echo moved")
            assert out["stdout"] == "moved\n"
            assert locks == ["w1", "w2", "w1"]  # the hint was stale: the lock again
            assert (await gw.manager.session("acme", "w1")).sandbox_id == w2
            await settled(gw)
            await gw.manager.close("acme", "w1")
            await gw.manager.close("acme", "w2")

    try:
        asyncio.run(scenario())
    finally:
        assert not destroy_runtime_dir(data_dir)
