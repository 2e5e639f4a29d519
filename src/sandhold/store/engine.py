"""The store's engine: SQLite's pragmas, PostgreSQL's pool and its check of idle connections."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError

PING_IDLE_S = 5.0  # a pooled PostgreSQL connection idle for longer is pinged before use


def make_engine(url: str, autocommit: bool = False) -> Engine:
    """``autocommit`` (PostgreSQL): every connection in autocommit from the start, so a
    statement is one round trip (switching a pooled connection per checkout costs two more)."""
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
    extra: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
    engine = create_engine(url, pool_size=10, max_overflow=20, **extra)

    # Pessimistic disconnect handling only for a connection idle for a while (a server restart
    # or an idle timeout closes those): pool_pre_ping's round trip on every checkout cost a
    # warm tool call five of its round trips. Raising DisconnectionError makes the pool drop
    # the connection and check out another (SQLAlchemy's documented checkout-event recipe).
    @event.listens_for(engine, "connect")
    @event.listens_for(engine, "checkin")
    def _idle(_dbapi: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("idle_since", 0.0) < PING_IDLE_S:
            return
        try:
            cur = dbapi.cursor()
            cur.execute("SELECT 1")
            cur.close()
            # Out of autocommit (as checkin leaves it) the ping began a transaction, and a
            # checkout for autocommit could not switch a connection in one.
            dbapi.rollback()
        except Exception as e:
            raise DisconnectionError(f"pooled connection is dead: {e}") from e

    return engine
