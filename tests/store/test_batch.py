"""The reclaimer's set-based queries (store/batch.py) on SQLite and on a real PostgreSQL: the
same once-per-pause, lock-if-free, no-live-use and fencing rules as the per-session queries,
over more rows than one statement takes (``CHUNK``)."""

from __future__ import annotations

import time

from sandhold.store.batch import CHUNK, Stop
from sandhold.store.db import Store

N = CHUNK + 7  # two statements per step


def sessions_with_sandboxes(store: Store, n: int) -> dict[int, str]:
    """``n`` sessions, each with a sandbox (``sbx-<i>``); returns pk -> sandbox id."""
    out = {}
    for i in range(n):
        row, token, _ = store.open_and_lock("acme", f"s{i}", 30)
        assert token is not None and store.set_sandbox(row.pk, token, f"sbx-{i}", {})
        store.unlock(row.pk, token)
        out[row.pk] = f"sbx-{i}"
    return out


def event(pk: int, kind: str) -> dict[str, object]:
    return {"at": time.time(), "tenant_id": "acme", "session_id": f"pk{pk}", "kind": kind,
            "replica": "r", "sandbox_id": None, "duration_ms": None, "reason": "test",
            "provider_state": None}  # fmt: skip


def test_each_stop_is_recorded_once(store: Store) -> None:
    wanted = sessions_with_sandboxes(store, N)
    pks = sorted(wanted)
    stops = [Stop(pk, sid, 1000.0 + pk, event(pk, "sandbox_paused")) for pk, sid in wanted.items()]
    stops[0] = Stop(pks[0], "another-sandbox", 5.0, event(pks[0], "sandbox_paused"))
    assert store.record_stops(stops) == set(pks[1:])
    assert store.record_stops(stops) == set()  # a second pass, or another replica: nothing
    assert len(store.events("sandbox_paused")) == N - 1
    # The same sandbox paused again later (a new endAt): recorded again, like record_pause_once.
    again = [Stop(pks[1], wanted[pks[1]], 9999.0, event(pks[1], "sandbox_paused"))]
    assert store.record_stops(again) == {pks[1]}
    assert store.record_pause_once(pks[1], wanted[pks[1]], 9999.0) is False


def test_reclaim_locks_only_free_unchanged_unused_sessions(store: Store) -> None:
    wanted = sessions_with_sandboxes(store, N)
    pks = sorted(wanted)
    busy, changed, used, expired_use = pks[0], pks[1], pks[2], pks[3]
    assert store.try_lock(busy, 60) is not None
    token = store.try_lock(changed, 60)
    assert token is not None and store.set_sandbox(changed, token, "a-newer-sandbox", {})
    store.unlock(changed, token)
    for pk, ttl in ((used, 600), (expired_use, -1)):
        token = store.try_lock(pk, 60)
        assert token is not None
        store.add_use_and_unlock(pk, token, wanted[pk], "r", "run_command", ttl)

    token, outcome = store.lock_for_reclaim(wanted, 30)
    assert outcome[busy] == "busy" and outcome[changed] == "changed"
    assert outcome[used] == "in_use" and outcome[expired_use] == "locked"
    locked = [pk for pk, o in outcome.items() if o == "locked"]
    assert len(locked) == N - 3
    # Held with the token: nobody else gets them; the skipped ones are free again (but busy).
    assert store.try_lock(locked[-1], 30) is None
    assert store.try_lock(changed, 30) is not None and store.try_lock(used, 30) is not None
    # A second reclaimer at the same moment gets none of them.
    _, second = store.lock_for_reclaim({pk: wanted[pk] for pk in locked}, 30)
    assert set(second.values()) == {"busy"}

    events = [event(pk, "sandbox_reclaimed") for pk in locked[:-1]]
    assert store.finish_reclaim(token, locked, locked[:-1], events) == N - 4
    rows = {r.pk: r for r in store.sessions("acme", limit=2 * N)}
    for pk in locked:
        assert rows[pk].lock_owner is None
        assert rows[pk].sandbox_id == (wanted[pk] if pk == locked[-1] else None)
    assert rows[busy].sandbox_id == wanted[busy] and rows[used].sandbox_id == wanted[used]
    assert len(store.events("sandbox_reclaimed")) == N - 4


def test_finishing_is_fenced_by_the_lock(store: Store) -> None:
    """A reclaimer whose lease ran out and was taken over clears nothing of the new holder's."""
    wanted = sessions_with_sandboxes(store, 3)
    token, outcome = store.lock_for_reclaim(wanted, -1)  # a lease that is over at once
    assert set(outcome.values()) == {"locked"}
    pk = min(wanted)
    other = store.try_lock(pk, 60)
    assert other is not None
    assert store.finish_reclaim(token, list(wanted), list(wanted), []) == 2
    row = store.session_by_pk(pk)
    assert row is not None and row.sandbox_id == wanted[pk] and row.lock_owner == other
