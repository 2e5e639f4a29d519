"""Set-based queries of the reclaimer: a pass over thousands of sessions costs a handful of store
transactions (each of a few statements over up to ``CHUNK`` rows), not several per session.

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

from sqlalchemy import ColumnElement, bindparam, delete, insert, or_, select, update
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from sandhold.store.models import Event, Session, SessionUse

CHUNK = 500  # rows per statement: far below SQLite's (32766) and PostgreSQL's (65535) bind limits
T = TypeVar("T")
Outcome = Literal["locked", "busy", "in_use", "changed"]


def lock_free(now: float) -> ColumnElement[bool]:
    """A session's lease lock can be taken: nobody holds it, or its holder's lease ran out."""
    return or_(Session.lock_owner.is_(None), Session.lock_until < now)


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


class BatchQueries:
    db: sessionmaker[OrmSession]

    def record_stops(self, stops: Sequence[Stop]) -> set[int]:
        """``record_pause_once`` for many sessions in one transaction, with their events: returns
        the sessions whose stop this call recorded (others recorded it already, or the session
        has another sandbox now). Per chunk: the rows are write-locked first (a no-op update:
        SQLite's write lock, PostgreSQL's row locks), read, and only those still to record are
        written, so that two replicas recording together never both count one."""
        done: set[int] = set()
        if not stops:
            return done
        by_pk = {s.pk: s for s in stops}
        with self.db.begin() as db:
            for part in chunks(list(by_pk)):
                db.execute(
                    update(Session)
                    .where(Session.id.in_(part))
                    .values(recorded_pause_end_at=Session.recorded_pause_end_at)
                    .execution_options(synchronize_session=False)
                )
                rows = db.execute(
                    select(Session.id, Session.sandbox_id, Session.recorded_pause_end_at).where(
                        Session.id.in_(part)
                    )
                )
                todo = [
                    pk for pk, sandbox, recorded in rows
                    if sandbox == by_pk[pk].sandbox_id and recorded != by_pk[pk].end_at
                ]  # fmt: skip
                if todo:
                    db.connection().execute(
                        update(Session)
                        .where(Session.id == bindparam("pk"))
                        .values(recorded_pause_end_at=bindparam("end_at")),
                        [{"pk": pk, "end_at": by_pk[pk].end_at} for pk in todo],
                    )
                    done.update(todo)
            events = [s.event for s in stops if s.pk in done]
            if events:
                db.execute(insert(Event), events)
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
        with self.db.begin() as db:
            for part in chunks(pks):
                db.execute(
                    update(Session)
                    .where(Session.id.in_(part), lock_free(now))
                    .values(lock_owner=token, lock_until=now + ttl_s)
                    .execution_options(synchronize_session=False)
                )
            mine: dict[int, str | None] = {}
            for part in chunks(pks):
                rows = db.execute(
                    select(Session.id, Session.sandbox_id).where(
                        Session.id.in_(part), Session.lock_owner == token
                    )
                )
                mine.update((pk, sandbox_id) for pk, sandbox_id in rows)
            used: set[int] = set()
            for part in chunks(list(mine)):
                # expired uses are debris of a replica that died mid-call
                db.execute(
                    delete(SessionUse)
                    .where(SessionUse.session_pk.in_(part), SessionUse.expires_at < now)
                    .execution_options(synchronize_session=False)
                )
                used.update(
                    db.scalars(
                        select(SessionUse.session_pk)
                        .where(SessionUse.session_pk.in_(part), SessionUse.expires_at >= now)
                        .distinct()
                    )
                )
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
            for part in chunks(release):
                db.execute(
                    update(Session)
                    .where(Session.id.in_(part), Session.lock_owner == token)
                    .values(lock_owner=None, lock_until=None)
                    .execution_options(synchronize_session=False)
                )
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
        with self.db.begin() as db:
            for part in chunks(reclaimed):
                res = db.execute(
                    update(Session)
                    .where(Session.id.in_(part), Session.lock_owner == token)
                    .values(sandbox_id=None, sandbox_handle=None, recorded_pause_end_at=None,
                            create_reserved_until=None, lock_owner=None, lock_until=None)
                    .execution_options(synchronize_session=False)
                )  # fmt: skip
                cleared += res.rowcount  # type: ignore[attr-defined]
            self._unlock_all(db, token, locked)
            if events:
                db.execute(insert(Event), list(events))
        return cleared

    def unlock_many(self, token: str, locked: Sequence[int]) -> None:
        with self.db.begin() as db:
            self._unlock_all(db, token, locked)

    @staticmethod
    def _unlock_all(db: OrmSession, token: str, locked: Sequence[int]) -> None:
        for part in chunks(locked):
            db.execute(
                update(Session)
                .where(Session.id.in_(part), Session.lock_owner == token)
                .values(lock_owner=None, lock_until=None)
                .execution_options(synchronize_session=False)
            )
