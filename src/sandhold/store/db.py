"""The store's engine, migrations and every query the gateway makes.

Methods are synchronous and short (one transaction each); the gateway calls them on worker
threads. Locks are leases (``lock_owner``/``lock_until``) taken with a conditional UPDATE, so
they behave the same on SQLite and PostgreSQL and no transaction stays open across a slow
provider call.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Engine,
    and_,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from sandhold.errors import LockLost
from sandhold.store.batch import BatchQueries
from sandhold.store.batch import lock_free as _lock_free
from sandhold.store.models import Deliverable, Event, Session, SessionUse, Tenant
from sandhold.store.schema import run_migrations


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
            s.id, s.tenant_id, s.session_id, s.state, s.sandbox_id, s.sandbox_handle,
            s.generation or 0, s.recorded_pause_end_at, s.lock_owner, s.lock_until,
            s.created_at, s.closed_at,
        )  # fmt: skip


# SessionRow's fields, as columns of the sessions table, in its order
_ROW_COLUMNS = ("id", "tenant_id", "session_id", "state", "sandbox_id", "sandbox_handle",
                "generation", "recorded_pause_end_at", "lock_owner", "lock_until", "created_at",
                "closed_at")  # fmt: skip


def _row(m: Any) -> SessionRow:
    fields = {f: m[f] for f in _ROW_COLUMNS}
    return SessionRow(pk=fields.pop("id"), **{**fields, "generation": fields["generation"] or 0})


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(conn: Any, _record: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
            cur.execute("PRAGMA synchronous=NORMAL")  # WAL: no fsync per commit
            cur.execute("PRAGMA foreign_keys=ON")
            # busy_timeout covers a transaction whose first statement writes; one that reads
            # first and then writes fails at once if another writer committed in between (a
            # WAL snapshot cannot be upgraded). Write transactions here start with their write.
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)


class Store(BatchQueries):
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.db = sessionmaker(self.engine, expire_on_commit=False)

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
        with self.db() as db:
            return db.get(Tenant, tenant_id)

    def tenant_by_key(self, api_key: str) -> Tenant | None:
        with self.db() as db:
            return db.scalars(
                select(Tenant).where(Tenant.api_key_sha256 == key_digest(api_key))
            ).first()

    def tenants(self) -> list[Tenant]:
        with self.db() as db:
            return list(db.scalars(select(Tenant).order_by(Tenant.id)))

    # -- sessions -------------------------------------------------------------------------------
    def get_session(self, tenant_id: str, session_id: str) -> SessionRow | None:
        with self.db() as db:
            s = db.scalars(
                select(Session).where(
                    Session.tenant_id == tenant_id, Session.session_id == session_id
                )
            ).first()
            return SessionRow.of(s) if s else None

    def session_by_pk(self, pk: int) -> SessionRow | None:
        with self.db() as db:
            s = db.get(Session, pk)
            return SessionRow.of(s) if s else None

    def sessions(self, tenant_id: str | None = None, limit: int = 1000) -> list[SessionRow]:
        q = select(Session).order_by(Session.id).limit(limit)
        if tenant_id is not None:
            q = q.where(Session.tenant_id == tenant_id)
        with self.db() as db:
            return [SessionRow.of(s) for s in db.scalars(q)]

    def sessions_with_sandboxes(self) -> dict[str, SessionRow]:
        """Every session that has a sandbox, by sandbox id (columns, not ORM objects: a reclaim
        pass reads thousands)."""
        cols = [Session.__table__.c[f] for f in _ROW_COLUMNS]
        with self.db() as db:
            rows = db.execute(select(*cols).where(Session.sandbox_id.is_not(None)))
            return {r.sandbox_id: _row(r._mapping) for r in rows if r.sandbox_id}

    def label_session(self, tenant_id: str, session_id: str, scenario: str) -> bool:
        """Set a session's scenario (the console's grouping); False if there is no session."""
        where = (Session.tenant_id == tenant_id, Session.session_id == session_id)
        with self.db.begin() as db:
            res = db.execute(update(Session).where(*where).values(scenario=scenario))
            return bool(res.rowcount)  # type: ignore[attr-defined]

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
            db.execute(update(Tenant).where(Tenant.id == tenant_id)
                       .values(updated_at=Tenant.updated_at))  # fmt: skip
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

    def try_lock(self, pk: int, ttl_s: float) -> str | None:
        """Take the session's lease lock if it is free or expired; returns the token or None."""
        token = uuid.uuid4().hex
        now = time.time()
        with self.db.begin() as db:
            res = db.execute(
                update(Session)
                .where(Session.id == pk, _lock_free(now))
                .values(lock_owner=token, lock_until=now + ttl_s)
            )
            return token if res.rowcount == 1 else None  # type: ignore[attr-defined]

    def open_and_lock(
        self, tenant_id: str, session_id: str, ttl_s: float
    ) -> tuple[SessionRow, str | None, bool]:
        """A tool call's first transaction: the session's row (inserted if new) with its lease
        lock taken if free or expired. Returns (row, token or None, whether this created it).
        It starts with a write, so that SQLite takes its write lock (waiting for it) before any
        read: upgrading a read transaction fails at once when another writer got in between."""
        token = uuid.uuid4().hex
        where = (Session.tenant_id == tenant_id, Session.session_id == session_id)
        for _attempt in range(2):
            try:
                with self.db.begin() as db:
                    now = time.time()
                    res = db.execute(
                        update(Session).where(*where, _lock_free(now))
                        .values(lock_owner=token, lock_until=now + ttl_s)
                        .execution_options(synchronize_session=False)
                    )  # fmt: skip
                    got = res.rowcount == 1  # type: ignore[attr-defined]
                    s = db.scalars(select(Session).where(*where)).first()
                    created = s is None
                    if s is None:
                        s = Session(tenant_id=tenant_id, session_id=session_id, state="open",
                                    generation=0, created_at=now, lock_owner=token,
                                    lock_until=now + ttl_s)  # fmt: skip
                        db.add(s)
                        db.flush()
                        got = True
                    return SessionRow.of(s), token if got else None, created
            except IntegrityError:
                pass  # another replica inserted it at the same moment: lock theirs
        raise AssertionError("unreachable: the session row exists after an IntegrityError")

    def add_use_and_unlock(
        self, pk: int, token: str, sandbox_id: str, replica: str, tool: str, ttl_s: float
    ) -> str:
        """Register a tool call in flight and release the lease lock, in one transaction."""
        use_id = uuid.uuid4().hex
        now = time.time()
        with self.db.begin() as db:
            db.add(SessionUse(id=use_id, session_pk=pk, sandbox_id=sandbox_id, replica=replica,
                              tool=tool, started_at=now, expires_at=now + ttl_s))  # fmt: skip
            db.execute(
                update(Session)
                .where(Session.id == pk, Session.lock_owner == token)
                .values(lock_owner=None, lock_until=None)
            )
        return use_id

    def end_use_and_lock(
        self, use_id: str, pk: int, ttl_s: float
    ) -> tuple[str | None, list[float]]:
        """A tool call ended: forget it, and take the lease lock if free (no waiting) to set the
        keep-alive. Returns (token or None, expiry times of the calls still in flight)."""
        token = uuid.uuid4().hex
        now = time.time()
        with self.db.begin() as db:
            db.execute(delete(SessionUse).where(SessionUse.id == use_id))
            res = db.execute(
                update(Session)
                .where(Session.id == pk, _lock_free(now))
                .values(lock_owner=token, lock_until=now + ttl_s)
            )  # fmt: skip
            if res.rowcount != 1:  # type: ignore[attr-defined]
                return None, []
            db.execute(  # expired uses are debris of a replica that died mid-call
                delete(SessionUse).where(SessionUse.session_pk == pk, SessionUse.expires_at < now)
            )
            live = db.scalars(
                select(SessionUse.expires_at).where(
                    SessionUse.session_pk == pk, SessionUse.expires_at >= now
                )
            )
            return token, list(live)

    def unlock(self, pk: int, token: str, events: Sequence[dict[str, Any]] = ()) -> None:
        """Release the lease lock, and write ``events`` (timeline rows) in the same transaction:
        a tool call's end costs one round trip less."""
        with self.db.begin() as db:
            db.execute(
                update(Session)
                .where(Session.id == pk, Session.lock_owner == token)
                .values(lock_owner=None, lock_until=None)
            )
            if events:
                db.execute(insert(Event), list(events))

    def set_sandbox(
        self, pk: int, token: str, sandbox_id: str | None, handle: dict[str, Any] | None
    ) -> bool:
        """Record the session's sandbox, only while ``token`` still holds the lock (fencing):
        False means the lock expired and someone else may have changed the session."""
        with self.db.begin() as db:
            res = db.execute(
                update(Session)
                .where(Session.id == pk, Session.lock_owner == token)
                .values(
                    sandbox_id=sandbox_id,
                    sandbox_handle=handle,
                    recorded_pause_end_at=None,
                    create_reserved_until=None,
                    generation=Session.generation + (1 if sandbox_id else 0),
                )
            )
            return res.rowcount == 1  # type: ignore[attr-defined]

    def set_handle(self, pk: int, token: str, handle: dict[str, Any]) -> bool:
        """Update what is remembered of the session's sandbox (same fencing as set_sandbox)."""
        with self.db.begin() as db:
            res = db.execute(
                update(Session)
                .where(Session.id == pk, Session.lock_owner == token)
                .values(sandbox_handle=handle)
            )
            return res.rowcount == 1  # type: ignore[attr-defined]

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
        with self.db.begin() as db:
            res = db.execute(
                update(Session)
                .where(
                    Session.id == pk,
                    Session.sandbox_id == sandbox_id,
                    or_(
                        Session.recorded_pause_end_at.is_(None),
                        Session.recorded_pause_end_at != end_at,
                    ),
                )
                .values(recorded_pause_end_at=end_at)
            )
            return res.rowcount == 1  # type: ignore[attr-defined]

    # -- uses -----------------------------------------------------------------------------------
    def live_uses(self, pk: int) -> list[float]:
        """Expiry times of the session's tool calls still in flight."""
        now = time.time()
        with self.db.begin() as db:
            # expired uses are debris of a replica that died mid-call
            db.execute(
                delete(SessionUse).where(
                    and_(SessionUse.session_pk == pk, SessionUse.expires_at < now)
                )
            )
            return list(
                db.scalars(
                    select(SessionUse.expires_at).where(
                        SessionUse.session_pk == pk, SessionUse.expires_at >= now
                    )
                )
            )

    # -- deliverables ---------------------------------------------------------------------------
    def add_deliverable(self, **fields: Any) -> Deliverable:
        with self.db.begin() as db:
            d = Deliverable(**fields)
            db.add(d)
            return d

    def get_deliverable(self, tenant_id: str, deliverable_id: str) -> Deliverable | None:
        with self.db() as db:
            d = db.get(Deliverable, deliverable_id)
            return d if d is not None and d.tenant_id == tenant_id else None

    def deliverables(self, tenant_id: str, session_id: str) -> list[Deliverable]:
        with self.db() as db:
            return list(
                db.scalars(
                    select(Deliverable)
                    .where(Deliverable.tenant_id == tenant_id, Deliverable.session_id == session_id)
                    .order_by(Deliverable.created_at)
                )
            )

    # -- timeline -------------------------------------------------------------------------------
    def add_event(self, **fields: Any) -> None:
        fields.setdefault("at", time.time())
        with self.db.begin() as db:
            db.add(Event(**fields))

    def add_events(self, events: Sequence[dict[str, Any]]) -> None:
        if events:
            with self.db.begin() as db:
                db.execute(insert(Event), list(events))

    def timeline(self, tenant_id: str, session_id: str, limit: int = 1000) -> list[Event]:
        with self.db() as db:
            return list(
                db.scalars(
                    select(Event)
                    .where(Event.tenant_id == tenant_id, Event.session_id == session_id)
                    .order_by(Event.id)
                    .limit(limit)
                )
            )

    def events(self, kind: str | None = None) -> list[Event]:
        q = select(Event).order_by(Event.id)
        if kind is not None:
            q = q.where(Event.kind == kind)
        with self.db() as db:
            return list(db.scalars(q))

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
            sessions = db.scalar(
                select(func.count()).where(Session.tenant_id == tenant_id)
            )  # fmt: skip
        by_kind = [
            {
                "kind": kind, "tool": tool, "count": n, "errors": errors,
                "bytes_in": int(bin_), "bytes_out": int(bout),
                "avg_ms": round(avg, 2) if avg is not None else None,
                "max_ms": round(mx, 2) if mx is not None else None,
            }
            for kind, tool, n, errors, bin_, bout, avg, mx in rows
        ]  # fmt: skip
        return {
            "tenant_id": tenant_id,
            "sessions": int(sessions or 0),
            "live_sandboxes": self.count_live_sandboxes(tenant_id),
            "events": by_kind,
        }
