"""Set-based queries of the reclaimer: a pass over thousands of sessions costs a handful of store
transactions (each of a few statements over up to ``CHUNK`` rows), not several per session.
They run on a Core connection with statements built once (``IN`` lists as expanding bound
parameters) and write the timeline's rows in one executemany per transaction: 20,000 events
through the ORM's bulk insert were most of a 10,000-sandbox pass (docs/benchmarks.md).

The semantics are the per-session queries' of ``db.py``: a pause is recorded once per endAt by
whoever writes it first (``record_pause_once``); a session's lease lock is taken only if free or
expired (``try_lock``), every write under it is fenced by the token, and a session with a tool
call in flight is not touched (``live_uses``, read after the lock is taken).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection, Engine, bindparam, delete, select, update

from sandhold.store import statements as q
from sandhold.store.statements import RELEASE, S, U

CHUNK = 500  # rows per statement: far below SQLite's (32766) and PostgreSQL's (65535) bind limits
T = TypeVar("T")
Outcome = Literal["locked", "busy", "in_use", "changed"]


def chunks(items: Sequence[T], size: int | None = None) -> Iterator[Sequence[T]]:
    size = size or CHUNK
    for i in range(0, len(items), size):
        yield items[i : i + size]


@dataclass(frozen=True)
class Stop:
    """A pause (or failure) of a session's sandbox seen at the provider, to record once, with the
    timeline event (``Event`` columns) that says so."""

    pk: int
    sandbox_id: str
    end_at: float
    event: dict[str, Any]


# Statements of the batches, built once; ``pks``: a chunk of session ids.
IN_PKS = S.c.id.in_(bindparam("pks", expanding=True))
MINE_IN = (IN_PKS, S.c.lock_owner == bindparam("token"))
# a no-op write of one row: SQLite's write lock (the whole database's) held to the commit
TOUCH = (
    update(S)
    .where(S.c.id == bindparam("pk"))
    .values(recorded_pause_end_at=S.c.recorded_pause_end_at)
)
# PostgreSQL: the rows' locks (SQLite has no FOR UPDATE, and needs none under its write lock)
STOP_STATE = (
    select(S.c.id, S.c.sandbox_id, S.c.recorded_pause_end_at).where(IN_PKS).with_for_update()
)
RECORD_STOP = (
    update(S).where(S.c.id == bindparam("pk")).values(recorded_pause_end_at=bindparam("end_at"))
)
LOCK_FREE_IN = update(S).where(IN_PKS, q.FREE).values(**q.TAKE)
LOCKED_BY = select(S.c.id, S.c.sandbox_id).where(*MINE_IN)
USES_IN = U.c.session_pk.in_(bindparam("pks", expanding=True))
EXPIRED_IN = delete(U).where(USES_IN, U.c.expires_at < bindparam("now"))
USED_IN = select(U.c.session_pk).where(USES_IN, U.c.expires_at >= bindparam("now")).distinct()
UNLOCK_IN = update(S).where(*MINE_IN).values(**RELEASE)
CLEAR_IN = (
    update(S)
    .where(*MINE_IN)
    .values(
        sandbox_id=None,
        sandbox_handle=None,
        recorded_pause_end_at=None,
        create_reserved_until=None,
        **RELEASE,
    )
)


class BatchQueries:
    engine: Engine

    def record_stops(self, stops: Sequence[Stop]) -> set[int]:
        """``record_pause_once`` for many sessions in one transaction, with their events: returns
        the sessions whose stop this call recorded (others recorded it already, or the session
        has another sandbox now). The rows are write-locked as they are read (PostgreSQL: FOR
        UPDATE; SQLite: its database-wide write lock, taken first by a no-op write of one row)
        and only those still to record are written, so that two replicas recording together
        never both count one."""
        done: set[int] = set()
        if not stops:
            return done
        by_pk = {s.pk: s for s in stops}
        with self.engine.begin() as conn:
            conn.execute(TOUCH, {"pk": stops[0].pk})
            for part in chunks(list(by_pk)):
                todo = [
                    pk
                    for pk, sandbox, recorded in conn.execute(STOP_STATE, {"pks": part})
                    if sandbox == by_pk[pk].sandbox_id and recorded != by_pk[pk].end_at
                ]
                if todo:
                    conn.execute(
                        RECORD_STOP, [{"pk": pk, "end_at": by_pk[pk].end_at} for pk in todo]
                    )
                    done.update(todo)
            q.add_events(conn, [s.event for s in stops if s.pk in done])
        return done

    def lock_for_reclaim(
        self, wanted: dict[int, str], ttl_s: float
    ) -> tuple[str, dict[int, Outcome]]:
        """Take the lease locks of many sessions at once, for a reclaim of the sandbox each is
        expected to have (``wanted``: session pk -> sandbox id). Returns the token and, per
        session, ``locked`` (held with the token: kill it, then ``finish_reclaim``), ``busy``
        (someone else holds the lock), ``changed`` (the session has another sandbox now) or
        ``in_use`` (a tool call is in flight). Only ``locked`` sessions keep the lock.

        The uses are read after the locks are taken, in a statement of its own (a fresh snapshot
        on PostgreSQL): a call registers its use before it releases the lock, so every use that
        matters is visible by then, and no new one can start while the lock is held."""
        token = uuid.uuid4().hex
        now = time.time()
        pks = list(wanted)
        lock = {"token": token, "now": now, "until": now + ttl_s}
        with self.engine.begin() as conn:
            for part in chunks(pks):
                conn.execute(LOCK_FREE_IN, {"pks": part, **lock})
            mine: dict[int, str | None] = {}
            for part in chunks(pks):
                rows = conn.execute(LOCKED_BY, {"pks": part, "token": token})
                mine.update((pk, sandbox_id) for pk, sandbox_id in rows)
            used: set[int] = set()
            for part in chunks(list(mine)):
                # expired uses are debris of a replica that died mid-call
                conn.execute(EXPIRED_IN, {"pks": part, "now": now})
                used.update(conn.scalars(USED_IN, {"pks": part, "now": now}))
            outcome: dict[int, Outcome] = {}
            for pk in pks:
                if pk not in mine:
                    outcome[pk] = "busy"
                elif mine[pk] != wanted[pk]:
                    outcome[pk] = "changed"
                elif pk in used:
                    outcome[pk] = "in_use"
                else:
                    outcome[pk] = "locked"
            release = [pk for pk, o in outcome.items() if o in ("changed", "in_use")]
            self._unlock_all(conn, token, release)
        return token, outcome

    def finish_reclaim(
        self,
        token: str,
        locked: Sequence[int],
        reclaimed: Sequence[int],
        events: Sequence[dict[str, Any]],
    ) -> int:
        """After the kills of a ``lock_for_reclaim``: the ``reclaimed`` sessions have no sandbox
        any more (fenced by the token), every ``locked`` one is unlocked, the events are
        written; one transaction. Returns how many sessions were still ours to clear."""
        cleared = 0
        with self.engine.begin() as conn:
            for part in chunks(reclaimed):
                cleared += conn.execute(CLEAR_IN, {"pks": part, "token": token}).rowcount
            self._unlock_all(conn, token, locked)
            q.add_events(conn, events)
        return cleared

    def unlock_many(self, token: str, locked: Sequence[int]) -> None:
        with self.engine.begin() as conn:
            self._unlock_all(conn, token, locked)

    @staticmethod
    def _unlock_all(conn: Connection, token: str, locked: Sequence[int]) -> None:
        for part in chunks(locked):
            conn.execute(UNLOCK_IN, {"pks": part, "token": token})
