"""The statements of a tool call's hot path, built once (SQLAlchemy Core, bound parameters).

A warm tool call makes a few tiny transactions; through the ORM each cost ~1-1.5 ms of Python
on this host (unit of work, identity map, a statement object built and its cache key computed
per call), through prebuilt Core statements on a connection ~0.1 ms (measured in
docs/benchmarks.md, "Session gateway"). Parameter names are never column names (those are
the SET clause's in an executemany).
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, delete, insert, or_, select, update

from sandhold.store.models import Event, Session, SessionUse, Tenant

S = cast(Table, Session.__table__)
U = cast(Table, SessionUse.__table__)
E = cast(Table, Event.__table__)
T = cast(Table, Tenant.__table__)

# SessionRow's fields, as columns of the sessions table, in its order
ROW_COLUMNS = ("id", "tenant_id", "session_id", "state", "sandbox_id", "sandbox_handle",
               "generation", "recorded_pause_end_at", "lock_owner", "lock_until", "created_at",
               "closed_at")  # fmt: skip
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

ADD_EVENT = insert(E)

SET_SANDBOX = (
    update(S)
    .where(MINE)
    .values(
        sandbox_id=bindparam("sandbox"), sandbox_handle=bindparam("handle"),
        recorded_pause_end_at=None, create_reserved_until=None,
        generation=S.c.generation + bindparam("bump"),
    )
)  # fmt: skip
SET_HANDLE = update(S).where(MINE).values(sandbox_handle=bindparam("handle"))
RECORD_PAUSE = (
    update(S)
    .where(
        BY_PK, S.c.sandbox_id == bindparam("sandbox"),
        or_(S.c.recorded_pause_end_at.is_(None), S.c.recorded_pause_end_at != bindparam("end_at")),
    )
    .values(recorded_pause_end_at=bindparam("end_at"))
)  # fmt: skip

TENANT_COLS = [T.c.id, T.c.api_key_sha256, T.c.policy, T.c.created_at, T.c.updated_at]
TENANT_BY_ID = select(*TENANT_COLS).where(T.c.id == bindparam("tenant"))
TENANT_BY_KEY = select(*TENANT_COLS).where(T.c.api_key_sha256 == bindparam("digest"))


def event_rows(events: Any) -> list[dict[str, Any]]:
    """Timeline rows with every column (None where a kind has no value): an executemany takes
    its columns from the first row, so rows of different kinds must all have them all."""
    return [{f: e.get(f) for f in EVENT_FIELDS} for e in events]
