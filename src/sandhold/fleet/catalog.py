"""The fleet's catalog (store/models.py ``FleetHost``, ``FleetSandbox``): which host holds each
sandbox, at which generation, shared by every edge replica through one database.

Every change to a sandbox's row is a compare-and-set on its generation or its host, so two edges
acting at once (a create retried on another host, a lost host's sandboxes handled by two edges)
never both win. Methods are short synchronous transactions; the edge runs them on threads.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, Table, delete, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from sandhold.store.engine import make_engine
from sandhold.store.models import FleetHost, FleetSandbox
from sandhold.store.schema import run_migrations

H = cast(Table, FleetHost.__table__)
S = cast(Table, FleetSandbox.__table__)


@dataclass(frozen=True)
class Row:
    sandbox_id: str
    team: str
    host_id: str | None
    generation: int
    state: str  # running | paused | moving (being taken up by a host)
    stored: bool
    listed: dict[str, Any]
    started_at: float
    updated_at: float


@dataclass(frozen=True)
class HostRow:
    host_id: str
    address: str
    boot_id: str
    state: str  # ready | draining | lost
    capacity: int
    info: dict[str, Any]
    last_seen: float


class Catalog:
    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite")
        # Each method is a statement or two, each complete on its own (the compare-and-sets
        # need no transaction around them): on PostgreSQL in autocommit, one round trip each.
        self.engine = make_engine(url, autocommit=not self.sqlite)

    def _conn(self) -> contextlib.AbstractContextManager[Connection]:
        return self.engine.begin() if self.sqlite else self.engine.connect()

    def _savepoint(self, c: Connection) -> contextlib.AbstractContextManager[object]:
        """Where a failed insert must not end the transaction (SQLite's); in autocommit
        (PostgreSQL) there is none to end."""
        return c.begin_nested() if self.sqlite else contextlib.nullcontext()

    def migrate(self) -> None:
        engine = make_engine(self.url)  # (in transactions)
        try:
            run_migrations(engine)
        finally:
            engine.dispose()

    def close(self) -> None:
        self.engine.dispose()

    # -- sandboxes -----------------------------------------------------------------------------
    def get(self, sandbox_id: str) -> Row | None:
        with self._conn() as c:
            r = c.execute(select(S).where(S.c.sandbox_id == sandbox_id)).mappings().first()
        return Row(**r) if r is not None else None

    def record(
        self,
        sandbox_id: str,
        team: str,
        host_id: str,
        generation: int,
        listed: dict[str, Any],
        at: float,
        stored: bool | None = None,
    ) -> bool:
        """What ``host_id`` said at ``at`` (its clock) of a sandbox at ``generation``: written
        unless the catalog holds it at a newer generation (a host left behind by a move says
        nothing), or holds a newer word of the same host (a poll that crossed a pause). A
        sandbox the catalog does not know is added (a fork, a create whose edge died). False:
        nothing written."""
        values = _said(host_id, generation, listed, at)
        if stored is not None:
            values["stored"] = stored
        with self._conn() as c:
            got = c.execute(
                update(S)
                .where(S.c.sandbox_id == sandbox_id, S.c.generation <= generation)
                .where(
                    (S.c.generation < generation)
                    | (
                        (S.c.host_id == host_id)
                        & ((S.c.updated_at <= at) | (S.c.state == "moving"))
                    )
                )
                .values(**values)
            )
            if got.rowcount == 1:
                return True
            if c.execute(select(S.c.sandbox_id).where(S.c.sandbox_id == sandbox_id)).first():
                return False
            try:
                with self._savepoint(c):
                    c.execute(insert(S).values(**_new_row(sandbox_id, team, values)))
            except IntegrityError:
                return False
        return True

    def add(
        self,
        sandbox_id: str,
        team: str,
        host_id: str,
        generation: int,
        listed: dict[str, Any],
        at: float,
    ) -> bool:
        """A sandbox its host just made (a create's answer): one insert, one round trip. One
        the catalog has already (the host's poll came first) is recorded as any word of its
        host."""
        new = (sqlite_insert if self.sqlite else pg_insert)(S).on_conflict_do_nothing(
            index_elements=[S.c.sandbox_id]
        )  # (rowcount says nothing here on psycopg: RETURNING does)
        row = _new_row(sandbox_id, team, _said(host_id, generation, listed, at))
        with self._conn() as c:
            if c.execute(new.values(**row).returning(S.c.sandbox_id)).first() is not None:
                return True
        return self.record(sandbox_id, team, host_id, generation, listed, at)

    def forget(self, sandbox_id: str, host_id: str | None = None) -> bool:
        """Remove a sandbox (killed, or gone with its host); with ``host_id``, only while that
        host still holds it."""
        q = delete(S).where(S.c.sandbox_id == sandbox_id)
        if host_id is not None:
            q = q.where(S.c.host_id == host_id)
        with self._conn() as c:
            return c.execute(q).rowcount == 1

    def on_host(self, host_id: str) -> list[Row]:
        with self._conn() as c:
            rows = c.execute(select(S).where(S.c.host_id == host_id)).mappings().all()
        return [Row(**r) for r in rows]

    def release(self, sandbox_id: str, host_id: str, listed: dict[str, Any] | None = None) -> bool:
        """A stored sandbox whose host is gone or draining: in the store only, resumable on any
        host (at the generation it was stored at)."""
        values: dict[str, Any] = {"host_id": None, "state": "paused", "stored": True}
        if listed is not None:
            values["listed"] = listed
        with self._conn() as c:
            got = c.execute(
                update(S)
                .where(S.c.sandbox_id == sandbox_id, S.c.host_id == host_id)
                .values(**values)
            )
        return got.rowcount == 1

    def move(self, sandbox_id: str, generation: int, host_id: str) -> bool:
        """Give a sandbox that is in the store only (at ``generation``) to ``host_id`` at the
        next generation; False if another edge moved it first."""
        with self._conn() as c:
            got = c.execute(
                update(S)
                .where(S.c.sandbox_id == sandbox_id, S.c.generation == generation)
                .where(S.c.host_id.is_(None))
                .values(
                    host_id=host_id,
                    generation=generation + 1,
                    state="moving",
                    updated_at=time.time(),
                )
            )
        return got.rowcount == 1

    def unmove(self, sandbox_id: str, generation: int, host_id: str) -> bool:
        """Undo a ``move`` to generation ``generation`` that the host did not take up."""
        with self._conn() as c:
            got = c.execute(
                update(S)
                .where(S.c.sandbox_id == sandbox_id, S.c.generation == generation)
                .where(S.c.host_id == host_id, S.c.state == "moving")
                .values(host_id=None, generation=generation - 1, state="paused")
            )
        return got.rowcount == 1

    def listing(self, team: str | None, limit: int | None = None) -> list[Row]:
        """A team's sandboxes (None: everyone's), the newest first."""
        q = select(S).order_by(S.c.started_at.desc()).limit(limit)
        if team is not None:
            q = q.where(S.c.team == team)
        with self._conn() as c:
            rows = c.execute(q).mappings().all()
        return [Row(**r) for r in rows]

    # -- hosts ---------------------------------------------------------------------------------
    def seen(self, address: str, info: dict[str, Any]) -> HostRow | None:
        """A host answered: write what it said; returns what the catalog held before."""
        host_id = str(info["hostId"])
        now = time.time()
        values = {
            "address": address,
            "boot_id": str(info["bootId"]),
            "state": "draining" if info.get("draining") else "ready",
            "capacity": int(info["capacity"]),
            "info": {k: v for k, v in info.items() if k != "sandboxes"},
            "last_seen": now,
        }
        with self._conn() as c:
            old = c.execute(select(H).where(H.c.host_id == host_id)).mappings().first()
            if old is None:
                try:
                    with self._savepoint(c):
                        c.execute(insert(H).values(host_id=host_id, **values))
                except IntegrityError:
                    c.execute(update(H).where(H.c.host_id == host_id).values(**values))
            else:
                c.execute(update(H).where(H.c.host_id == host_id).values(**values))
        return HostRow(**old) if old is not None else None

    def hosts(self) -> list[HostRow]:
        with self._conn() as c:
            rows = c.execute(select(H)).mappings().all()
        return [HostRow(**r) for r in rows]

    def lose(self, host_id: str, silent_since: float) -> bool:
        """Mark a host lost if it has not been seen since ``silent_since``; True for the one
        edge that did it (and must now settle its sandboxes)."""
        with self._conn() as c:
            got = c.execute(
                update(H)
                .where(H.c.host_id == host_id, H.c.state != "lost")
                .where(H.c.last_seen < silent_since)
                .values(state="lost")
            )
        return got.rowcount == 1


def _said(host_id: str, generation: int, listed: dict[str, Any], at: float) -> dict[str, Any]:
    """The columns a host's word about one of its sandboxes sets."""
    state = listed.get("state", "running")
    said = {"host_id": host_id, "generation": generation, "state": state, "listed": listed}
    return {**said, "updated_at": at}


def _new_row(sandbox_id: str, team: str, said: dict[str, Any]) -> dict[str, Any]:
    """A sandbox's first row, from its host's word (``stored`` unless the word says)."""
    first = {"sandbox_id": sandbox_id, "team": team, "started_at": time.time(), "stored": False}
    return {**first, **said}
