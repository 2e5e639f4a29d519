"""The statements of a tool call's hot path, built once (SQLAlchemy Core, bound parameters).

A warm tool call makes a few tiny transactions; through the ORM each cost ~1-1.5 ms of Python
on this host (unit of work, identity map, a statement object built and its cache key computed
per call), through prebuilt Core statements on a connection ~0.1 ms (measured in
bench/results/history.md, "Session gateway"). Parameter names are never column names (those are
the SET clause's in an executemany).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

from pydantic_core import to_json
from sqlalchemy import (
    JSON,
    Connection,
    Dialect,
    Float,
    String,
    Table,
    and_,
    bindparam,
    delete,
    insert,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from sandhold.store.models import Event, Session, SessionUse, Tenant

S = cast(Table, Session.__table__)
U = cast(Table, SessionUse.__table__)
E = cast(Table, Event.__table__)
T = cast(Table, Tenant.__table__)

# SessionRow's fields, as columns of the sessions table, in its order
ROW_COLUMNS = (
    "id",
    "tenant_id",
    "session_id",
    "state",
    "sandbox_id",
    "sandbox_handle",
    "generation",
    "recorded_pause_end_at",
    "lock_owner",
    "lock_until",
    "created_at",
    "closed_at",
)
COLS = [S.c[f] for f in ROW_COLUMNS]
EVENT_FIELDS = tuple(c.name for c in E.c if c.name != "id")

# a session's lease lock is free, or its holder's lease ran out
FREE = or_(S.c.lock_owner.is_(None), S.c.lock_until < bindparam("now"))
BY_NAME = and_(S.c.tenant_id == bindparam("tenant"), S.c.session_id == bindparam("session"))
BY_PK = S.c.id == bindparam("pk")
MINE = and_(BY_PK, S.c.lock_owner == bindparam("token"))
TAKE: dict[str, Any] = {"lock_owner": bindparam("token"), "lock_until": bindparam("until")}
RELEASE: dict[str, Any] = {"lock_owner": None, "lock_until": None}

LOCK_BY_NAME = update(S).where(BY_NAME, FREE).values(**TAKE).returning(*COLS)
ROW_BY_NAME = select(*COLS).where(BY_NAME)
ROW_BY_PK = select(*COLS).where(BY_PK)
WITH_SANDBOX = select(
    *(null().label(c.name) if c.name == "sandbox_handle" else c for c in COLS)
).where(S.c.sandbox_id.is_not(None))
WITH_THIS_SANDBOX = WITH_SANDBOX.where(S.c.sandbox_id == bindparam("sandbox"))
INSERT_SESSION = insert(S).returning(*COLS)
LOCK_BY_PK = update(S).where(BY_PK, FREE).values(**TAKE)
UNLOCK = update(S).where(MINE).values(**RELEASE)

ADD_USE = insert(U)
# a call's own use, and its session's expired ones (debris of a replica that died mid-call)
EXPIRED = and_(U.c.session_pk == bindparam("pk"), U.c.expires_at < bindparam("now"))
EXPIRED_USES = delete(U).where(EXPIRED)
END_USES = delete(U).where(or_(U.c.id == bindparam("use_id"), EXPIRED))
LIVE_USES = select(U.c.expires_at).where(
    U.c.session_pk == bindparam("pk"), U.c.expires_at >= bindparam("now")
)

# "e_" + column: a bound name may not be a column's own in an INSERT's VALUES
ADD_EVENT = insert(E).values({f: bindparam("e_" + f) for f in EVENT_FIELDS})
JSON_FIELDS = frozenset(c.name for c in E.c if isinstance(c.type, JSON))

# PostgreSQL only (SQLite has no INSERT or DELETE in a WITH): two steps of the hot path in one
# statement, i.e. one round trip and one implicit transaction, so both happen or neither.
# A call's use registered and its session's lock released (nobody sees the lock free without
# the use):
ADD_USE_AND_UNLOCK = UNLOCK.add_cte(
    insert(U)
    .values(
        id=bindparam("use_id"),
        session_pk=bindparam("pk"),
        sandbox_id=bindparam("sandbox"),
        replica=bindparam("replica"),
        tool=bindparam("tool"),
        started_at=bindparam("started"),
        expires_at=bindparam("expires"),
    )
    .cte("new_use")
)
# A call's use registered on a session whose lock is free, whose state is open and whose
# sandbox is the one the caller knows running, the session's row held meanwhile (FOR UPDATE),
# so nobody takes the lock between: as if the lock were taken, the use added and the lock
# released at once. Returns the session's row; no row: nothing registered.
_USABLE = (BY_NAME, FREE, S.c.state == "open", S.c.sandbox_id == bindparam("sandbox", String))


def _new_use(src: Any) -> Any:
    values = select(
        bindparam("use_id", type_=String),
        src.c.id,
        src.c.sandbox_id,
        bindparam("replica", type_=String),
        bindparam("tool", type_=String),
        bindparam("now", type_=Float),
        bindparam("expires", type_=Float),
    ).select_from(src)
    if src is S:
        values = values.where(*_USABLE)
    columns = ["id", "session_pk", "sandbox_id", "replica", "tool", "started_at", "expires_at"]
    return insert(U).from_select(columns, values)


_FREE_ROW = select(*COLS).where(*_USABLE).with_for_update().cte("usable")
USE_IF_FREE = select(*_FREE_ROW.c).add_cte(_new_use(_FREE_ROW).cte("new_use"))
# SQLite: the same in one transaction of two statements (a write first: its write lock)
ADD_USE_IF_FREE = _new_use(S)
# A call's timeline row written and its use (and its session's expired ones) deleted; run with
# add_event_and, as ADD_EVENT's rows are:
END_USES_WITH_EVENT = END_USES.add_cte(ADD_EVENT.cte("new_event"))

SET_SANDBOX = (
    update(S)
    .where(MINE)
    .values(
        sandbox_id=bindparam("sandbox"),
        sandbox_handle=bindparam("handle"),
        recorded_pause_end_at=None,
        create_reserved_until=None,
        generation=S.c.generation + bindparam("bump"),
    )
)
SET_HANDLE = update(S).where(MINE).values(sandbox_handle=bindparam("handle"))
RECORD_PAUSE = (
    update(S)
    .where(
        BY_PK,
        S.c.sandbox_id == bindparam("sandbox"),
        or_(S.c.recorded_pause_end_at.is_(None), S.c.recorded_pause_end_at != bindparam("end_at")),
    )
    .values(recorded_pause_end_at=bindparam("end_at"))
)

TENANT_COLS = [T.c.id, T.c.api_key_sha256, T.c.policy, T.c.created_at, T.c.updated_at]
TENANT_BY_ID = select(*TENANT_COLS).where(T.c.id == bindparam("tenant"))
TENANT_BY_KEY = select(*TENANT_COLS).where(T.c.api_key_sha256 == bindparam("digest"))


def add_events(conn: Connection, events: Sequence[dict[str, Any]]) -> None:
    """Write timeline rows (``Event`` columns; a kind's missing ones are NULL) with one
    executemany straight to the driver: SQLAlchemy's per-row parameter processing was most of
    the cost of a reclaim pass's 20,000 rows. JSON values are serialized here (PostgreSQL: in
    psycopg's Json, typed json)."""
    if not events:
        return
    sql, names, positional = _compiled(ADD_EVENT, conn.dialect)
    rows = _event_rows(conn.dialect, names, events)
    if positional:
        conn.exec_driver_sql(sql, [tuple(r) for r in rows])
    else:
        keys = ["e_" + f for f in names]
        conn.exec_driver_sql(sql, [dict(zip(keys, r, strict=True)) for r in rows])


def add_event_and(
    conn: Connection, stmt: ClauseElement, event: dict[str, Any], params: dict[str, Any]
) -> Any:
    """Run ``stmt``, a statement with ADD_EVENT as a CTE (PostgreSQL), for one timeline row
    and ``params`` (its other parameters, by name), straight to the driver; its result."""
    sql, names, positional = _compiled(stmt, conn.dialect)
    assert not positional, "a CTE with an INSERT is PostgreSQL's (named parameters)"
    [row] = _event_rows(conn.dialect, names, [event])
    return conn.exec_driver_sql(
        sql, {**params, **{"e_" + f: v for f, v in zip(names, row, strict=True)}}
    )


def _event_rows(
    dialect: Dialect, names: tuple[str, ...], events: Sequence[dict[str, Any]]
) -> list[list[Any]]:
    dump = _json_dumper(dialect.name)
    json_at = [i for i, f in enumerate(names) if f in JSON_FIELDS]
    rows = []
    for e in events:
        row = [e.get(f) for f in names]
        for i in json_at:
            if row[i] is not None:
                row[i] = dump(row[i])
        rows.append(row)
    return rows


def _dumps(value: Any) -> str:
    """JSON text (pydantic-core's serializer: ~7x json.dumps on these small dicts)."""
    return to_json(value).decode()


def _json_dumper(dialect_name: str) -> Callable[[Any], Any]:
    if dialect_name == "postgresql":
        from psycopg.types.json import Json

        return lambda value: Json(value, dumps=_dumps)
    return _dumps


@functools.cache
def _compiled(stmt: ClauseElement, dialect: Dialect) -> tuple[str, tuple[str, ...], bool]:
    """``stmt``'s SQL for ``dialect`` (ADD_EVENT, or a statement with it as a CTE), the event
    fields of its parameters (in order) and whether they are positional (then ADD_EVENT's
    alone)."""
    c = cast(SQLCompiler, stmt.compile(dialect=dialect))
    positional = bool(c.positional and c.positiontup)
    order = c.positiontup if positional and c.positiontup else ["e_" + f for f in EVENT_FIELDS]
    return c.string, tuple(name.removeprefix("e_") for name in order), positional
