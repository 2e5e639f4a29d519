"""The store: migrations and every query the gateway makes (its engine: engine.py).

Methods are synchronous and short (one transaction each); the gateway calls them on worker
threads. Locks are leases (``lock_owner``/``lock_until``) taken with a conditional UPDATE, so
they behave the same on SQLite and PostgreSQL and no transaction stays open across a slow
provider call.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from sandhold.errors import LockLost
from sandhold.store import statements as q
from sandhold.store.batch import BatchQueries
from sandhold.store.engine import make_engine
from sandhold.store.events import EventQueries
from sandhold.store.models import Event, Session, Tenant
from sandhold.store.schema import run_migrations
from sandhold.store.statements import ROW_COLUMNS as _ROW_COLUMNS


def key_digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


@dataclass(frozen=True)
class SessionRow:
    pk: int
    tenant_id: str
    session_id: str
    state: str
    sandbox_id: str | None
    sandbox_handle: dict[str, Any] | None
    generation: int
    recorded_pause_end_at: float | None
    lock_owner: str | None
    lock_until: float | None
    created_at: float
    closed_at: float | None

    @classmethod
    def of(cls, s: Session) -> SessionRow:
        return cls(
            s.id,
            s.tenant_id,
            s.session_id,
            s.state,
            s.sandbox_id,
            s.sandbox_handle,
            s.generation or 0,
            s.recorded_pause_end_at,
            s.lock_owner,
            s.lock_until,
            s.created_at,
            s.closed_at,
        )


def _row(m: Any) -> SessionRow:
    fields = {f: m[f] for f in _ROW_COLUMNS}
    return SessionRow(pk=fields.pop("id"), **{**fields, "generation": fields["generation"] or 0})


def _tenant(r: Any) -> Tenant | None:
    """A tenant read as columns (a detached Tenant: nobody writes through it)."""
    return None if r is None else Tenant(**r._mapping)


class Store(BatchQueries, EventQueries):
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.db = sessionmaker(self.engine, expire_on_commit=False)
        # PostgreSQL: each statement its own transaction (autocommit), with no BEGIN or
        # COMMIT round trip; see the hot path below. (SQLite has no round trips, but a commit
        # per statement, and switching a pooled connection to autocommit costs a PRAGMA.)
        self.auto = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.sqlite = self.engine.dialect.name == "sqlite"

    def hot(self) -> contextlib.AbstractContextManager[Connection]:
        """A connection whose statements are each durable once done (PostgreSQL: autocommit),
        or all at the end of the block (SQLite: one transaction)."""
        return self.engine.begin() if self.sqlite else self.auto.connect()

    def _read(self) -> Connection:
        """A connection for one read (PostgreSQL: no BEGIN and ROLLBACK around it)."""
        return self.engine.connect() if self.sqlite else self.auto.connect()

    def close(self) -> None:
        self.engine.dispose()

    # -- schema ---------------------------------------------------------------------------------
    def migrate(self) -> None:
        """Bring the schema to the newest revision (see schema.py)."""
        run_migrations(self.engine)

    # -- tenants --------------------------------------------------------------------------------
    def put_tenant(self, tenant_id: str, policy: dict[str, Any], api_key: str | None) -> Tenant:
        now = time.time()
        values: dict[str, Any] = {"policy": policy, "updated_at": now}
        if api_key is not None:
            values["api_key_sha256"] = key_digest(api_key)
        for _attempt in range(2):
            try:
                with self.db.begin() as db:  # a write first: see open_and_lock
                    res = db.execute(update(Tenant).where(Tenant.id == tenant_id).values(**values))
                    if res.rowcount == 0:  # type: ignore[attr-defined]
                        db.add(Tenant(id=tenant_id, created_at=now, **values))
                    t = db.get(Tenant, tenant_id)
                    assert t is not None
                    return t
            except IntegrityError:
                pass  # replicas starting together inserted it at the same moment: update it
        raise AssertionError("unreachable: the tenant row exists after an IntegrityError")

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        with self._read() as conn:
            return _tenant(conn.execute(q.TENANT_BY_ID, {"tenant": tenant_id}).first())

    def tenant_by_digest(self, digest: str) -> Tenant | None:
        """The tenant whose API key has this sha256 (hex)."""
        with self._read() as conn:
            return _tenant(conn.execute(q.TENANT_BY_KEY, {"digest": digest}).first())

    def tenants(self) -> list[Tenant]:
        with self.db() as db:
            return list(db.scalars(select(Tenant).order_by(Tenant.id)))

    # -- sessions -------------------------------------------------------------------------------
    def get_session(self, tenant_id: str, session_id: str) -> SessionRow | None:
        with self._read() as conn:
            r = conn.execute(q.ROW_BY_NAME, {"tenant": tenant_id, "session": session_id}).first()
            return _row(r._mapping) if r else None

    def session_by_pk(self, pk: int) -> SessionRow | None:
        with self._read() as conn:
            r = conn.execute(q.ROW_BY_PK, {"pk": pk}).first()
            return _row(r._mapping) if r else None

    def sessions(self, tenant_id: str | None = None, limit: int = 1000) -> list[SessionRow]:
        q = select(Session).order_by(Session.id).limit(limit)
        if tenant_id is not None:
            q = q.where(Session.tenant_id == tenant_id)
        with self.db() as db:
            return [SessionRow.of(s) for s in db.scalars(q)]

    def sessions_with_sandboxes(self) -> dict[str, SessionRow]:
        """Every session that has a sandbox, by sandbox id, without its handle (None: a reclaim
        pass reads thousands of rows and needs no handle; tuples, no ORM objects)."""
        with self._read() as conn:
            rows = conn.execute(q.WITH_SANDBOX).all()
        return {r[4]: _without_handle(r) for r in rows if r[4]}

    def session_with_sandbox(self, sandbox_id: str) -> SessionRow | None:
        """The session that has this sandbox, without its handle (None: none has it)."""
        with self._read() as conn:
            r = conn.execute(q.WITH_THIS_SANDBOX, {"sandbox": sandbox_id}).first()
        return None if r is None else _without_handle(r)

    def label_session(self, tenant_id: str, session_id: str, scenario: str) -> bool:
        """Set a session's scenario (the console's grouping); False if there is no session."""
        where = (Session.tenant_id == tenant_id, Session.session_id == session_id)
        with self.db.begin() as db:
            res = db.execute(update(Session).where(*where).values(scenario=scenario))
            return bool(res.rowcount)  # type: ignore[attr-defined]

    def session_counts(self) -> tuple[list[tuple[str, str, int]], list[tuple[str, int]]]:
        """Sessions by (tenant, state), and open sessions with a sandbox by tenant (metrics)."""
        by_state = select(Session.tenant_id, Session.state, func.count()).group_by(
            Session.tenant_id, Session.state
        )
        with_sandbox = (
            select(Session.tenant_id, func.count())
            .where(Session.state == "open", Session.sandbox_id.is_not(None))
            .group_by(Session.tenant_id)
        )
        with self.db() as db:
            states = [(t, st, n) for t, st, n in db.execute(by_state)]
            sandboxes = [(t, n) for t, n in db.execute(with_sandbox)]
        return states, sandboxes

    def count_live_sandboxes(self, tenant_id: str) -> int:
        with self.db() as db:
            live = (Session.tenant_id == tenant_id, Session.sandbox_id.is_not(None))
            return int(db.scalar(select(func.count()).where(*live)) or 0)

    def reserve_create(
        self, tenant_id: str, pk: int, token: str, max_live: int, ttl_s: float
    ) -> int | None:
        """Hold one of the tenant's ``max_live`` slots for the create the session (locked with
        ``token``) is about to make; None when reserved, else how many are taken (nothing
        changes). The tenant's row is written first, which serializes reservations per tenant
        on PostgreSQL (row lock) and SQLite (write lock), so concurrent first calls on any
        replica each see the slots the others took. ``set_sandbox`` releases the slot."""
        now = time.time()
        with self.db.begin() as db:
            db.execute(
                update(Tenant).where(Tenant.id == tenant_id).values(updated_at=Tenant.updated_at)
            )
            taken = (
                db.scalar(
                    select(func.count()).where(
                        Session.tenant_id == tenant_id,
                        Session.id != pk,
                        or_(Session.sandbox_id.is_not(None), Session.create_reserved_until > now),
                    )
                )
                or 0
            )
            if taken >= max_live:
                return int(taken)
            res = db.execute(
                update(Session)
                .where(Session.id == pk, Session.lock_owner == token)
                .values(create_reserved_until=now + ttl_s)
            )
            if res.rowcount != 1:  # type: ignore[attr-defined]
                raise LockLost("lost the session lock before reserving a create")
            return None

    # -- a tool call's hot path ----------------------------------------------------------------
    # On PostgreSQL in autocommit, one round trip per statement: the lease lock and the uses are
    # rows that each statement changes atomically, and the order of the statements keeps the
    # rules (a use is committed before the lock is released; the lock is held before the uses
    # are read). On SQLite the same statements, in that order, in one transaction.
    def try_lock(self, pk: int, ttl_s: float) -> str | None:
        """Take the session's lease lock if it is free or expired; returns the token or None."""
        token = uuid.uuid4().hex
        now = time.time()
        with self.hot() as conn:
            res = conn.execute(
                q.LOCK_BY_PK, {"pk": pk, "now": now, "token": token, "until": now + ttl_s}
            )
            return token if res.rowcount == 1 else None

    def open_and_lock(
        self, tenant_id: str, session_id: str, ttl_s: float
    ) -> tuple[SessionRow, str | None, bool]:
        """A tool call's first statement: the session's row with its lease lock taken if free or
        expired (one UPDATE ... RETURNING); a new session's row is inserted, locked. Returns
        (row, token or None, whether this created it)."""
        token = uuid.uuid4().hex
        name = {"tenant": tenant_id, "session": session_id}
        for _attempt in range(2):
            try:
                with self.hot() as conn:
                    now = time.time()
                    lock = {"now": now, "token": token, "until": now + ttl_s}
                    r = conn.execute(q.LOCK_BY_NAME, {**name, **lock}).first()
                    if r is not None:
                        return _row(r._mapping), token, False
                    r = conn.execute(q.ROW_BY_NAME, name).first()
                    if r is not None:
                        return _row(r._mapping), None, False  # locked by someone else
                    r = conn.execute(
                        q.INSERT_SESSION,
                        {
                            "tenant_id": tenant_id,
                            "session_id": session_id,
                            "state": "open",
                            "generation": 0,
                            "created_at": now,
                            "lock_owner": token,
                            "lock_until": now + ttl_s,
                        },
                    ).one()
                    return _row(r._mapping), token, True
            except IntegrityError:
                pass  # another replica inserted it at the same moment: lock theirs
        raise AssertionError("unreachable: the session row exists after an IntegrityError")

    def use_if_free(
        self,
        tenant_id: str,
        session_id: str,
        sandbox_id: str,
        replica: str,
        tool: str,
        ttl_s: float,
    ) -> tuple[SessionRow, str] | None:
        """A warm call's one statement: register a use on the session if its lease lock is
        free, it is open and its sandbox is ``sandbox_id`` (one the caller knows runs past the
        call), holding the session's row meanwhile (PostgreSQL: FOR UPDATE; SQLite: its write
        lock), so that nobody takes the lock in between: the same as taking the lock, adding
        the use and releasing the lock, in one round trip. Returns (row, use id), or None
        (nothing registered: take the lock)."""
        use_id = uuid.uuid4().hex
        now = time.time()
        params = {
            "tenant": tenant_id,
            "session": session_id,
            "sandbox": sandbox_id,
            "use_id": use_id,
            "replica": replica,
            "tool": tool,
            "now": now,
            "expires": now + ttl_s,
        }
        with self.hot() as conn:
            if self.sqlite:
                if conn.execute(q.ADD_USE_IF_FREE, params).rowcount != 1:
                    return None
                r = conn.execute(q.ROW_BY_NAME, params).first()
            else:
                r = conn.execute(q.USE_IF_FREE, params).first()
        return None if r is None else (_row(r._mapping), use_id)

    def add_use_and_unlock(
        self, pk: int, token: str, sandbox_id: str, replica: str, tool: str, ttl_s: float
    ) -> str:
        """Register a tool call in flight, then release the lease lock: whoever takes the lock
        next sees the use."""
        use_id = uuid.uuid4().hex
        now = time.time()
        with self.hot() as conn:
            if not self.sqlite:  # one statement: one round trip
                conn.execute(
                    q.ADD_USE_AND_UNLOCK,
                    {
                        "use_id": use_id,
                        "pk": pk,
                        "sandbox": sandbox_id,
                        "replica": replica,
                        "tool": tool,
                        "started": now,
                        "expires": now + ttl_s,
                        "token": token,
                    },
                )
                return use_id
            conn.execute(
                q.ADD_USE,
                {
                    "id": use_id,
                    "session_pk": pk,
                    "sandbox_id": sandbox_id,
                    "replica": replica,
                    "tool": tool,
                    "started_at": now,
                    "expires_at": now + ttl_s,
                },
            )
            conn.execute(q.UNLOCK, {"pk": pk, "token": token})
        return use_id

    def end_use(self, use_id: str, pk: int, events: Sequence[dict[str, Any]] = ()) -> None:
        """A tool call ended: its ``events`` (timeline rows) written, then its use forgotten (and
        the session's expired ones, debris of a replica that died mid-call). PostgreSQL, one
        row (a tool call's): both in one statement, one round trip."""
        params = {"use_id": use_id, "pk": pk, "now": time.time()}
        with self.hot() as conn:
            if not self.sqlite and len(events) == 1:
                q.add_event_and(conn, q.END_USES_WITH_EVENT, events[0], params)
                return
            q.add_events(conn, events)
            conn.execute(q.END_USES, params)

    def lock_for_keep_alive(self, pk: int, ttl_s: float) -> tuple[str | None, list[float]]:
        """Take the lease lock if free (no waiting) to set the keep-alive after a call. Returns
        (token or None, expiry times of the calls still in flight, read with the lock held)."""
        token = uuid.uuid4().hex
        now = time.time()
        with self.hot() as conn:
            res = conn.execute(
                q.LOCK_BY_PK, {"pk": pk, "now": now, "token": token, "until": now + ttl_s}
            )
            if res.rowcount != 1:
                return None, []
            return token, list(conn.scalars(q.LIVE_USES, {"pk": pk, "now": now}))

    def unlock(self, pk: int, token: str, events: Sequence[dict[str, Any]] = ()) -> None:
        """Write ``events`` (timeline rows: a tool call's, with its end), then release the lease
        lock (were it released first, a crash in between would lose them)."""
        with self.hot() as conn:
            if events:
                q.add_events(conn, events)
            conn.execute(q.UNLOCK, {"pk": pk, "token": token})

    def set_sandbox(
        self, pk: int, token: str, sandbox_id: str | None, handle: dict[str, Any] | None
    ) -> bool:
        """Record the session's sandbox, only while ``token`` still holds the lock (fencing):
        False means the lock expired and someone else may have changed the session."""
        with self.hot() as conn:
            res = conn.execute(
                q.SET_SANDBOX,
                {
                    "pk": pk,
                    "token": token,
                    "sandbox": sandbox_id,
                    "handle": handle,
                    "bump": 1 if sandbox_id else 0,
                },
            )
            return res.rowcount == 1

    def set_handle(self, pk: int, token: str, handle: dict[str, Any]) -> bool:
        """Update what is remembered of the session's sandbox (same fencing as set_sandbox)."""
        with self.hot() as conn:
            res = conn.execute(q.SET_HANDLE, {"pk": pk, "token": token, "handle": handle})
            return res.rowcount == 1

    def mark_closed(self, pk: int, token: str) -> bool:
        with self.db.begin() as db:
            res = db.execute(
                update(Session)
                .where(Session.id == pk, Session.lock_owner == token)
                .values(state="closed", closed_at=time.time(), sandbox_id=None, sandbox_handle=None)
            )
            return res.rowcount == 1  # type: ignore[attr-defined]

    def record_pause_once(self, pk: int, sandbox_id: str, end_at: float) -> bool:
        """True for exactly one caller per pause (identified by the provider's endAt)."""
        with self.hot() as conn:
            res = conn.execute(q.RECORD_PAUSE, {"pk": pk, "sandbox": sandbox_id, "end_at": end_at})
            return res.rowcount == 1

    # -- uses -----------------------------------------------------------------------------------
    def live_uses(self, pk: int) -> list[float]:
        """Expiry times of the session's tool calls still in flight."""
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(q.EXPIRED_USES, {"pk": pk, "now": now})  # debris of a dead replica
            return list(conn.scalars(q.LIVE_USES, {"pk": pk, "now": now}))

    def aggregates(self, tenant_id: str) -> dict[str, Any]:
        """Per-tenant totals: sessions, live sandboxes, and per event kind and tool the count,
        errors, bytes and durations."""
        with self.db() as db:
            rows = db.execute(
                select(
                    Event.kind,
                    Event.tool,
                    func.count(),
                    func.count(Event.error),
                    func.coalesce(func.sum(Event.bytes_in), 0),
                    func.coalesce(func.sum(Event.bytes_out), 0),
                    func.avg(Event.duration_ms),
                    func.max(Event.duration_ms),
                )
                .where(Event.tenant_id == tenant_id)
                .group_by(Event.kind, Event.tool)
                .order_by(Event.kind, Event.tool)
            ).all()
            sessions = db.scalar(select(func.count()).where(Session.tenant_id == tenant_id))
        by_kind = [
            {
                "kind": kind,
                "tool": tool,
                "count": n,
                "errors": errors,
                "bytes_in": int(bin_),
                "bytes_out": int(bout),
                "avg_ms": round(avg, 2) if avg is not None else None,
                "max_ms": round(mx, 2) if mx is not None else None,
            }
            for kind, tool, n, errors, bin_, bout, avg, mx in rows
        ]
        return {
            "tenant_id": tenant_id,
            "sessions": int(sessions or 0),
            "live_sandboxes": self.count_live_sandboxes(tenant_id),
            "events": by_kind,
        }


def _without_handle(r: Any) -> SessionRow:
    # the columns are in SessionRow's order; the handle is NULL in WITH_SANDBOX's rows
    return SessionRow(r[0], r[1], r[2], r[3], r[4], None, r[6] or 0, r[7], r[8], r[9], r[10], r[11])
