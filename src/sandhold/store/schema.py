"""Running the store's Alembic migrations, on SQLite and PostgreSQL alike.

On SQLite a migration runs with foreign keys off, in one real transaction, and is checked with
``PRAGMA foreign_key_check`` before it commits. Batch mode (SQLite cannot alter most of a table)
copies a table and drops the original: with foreign keys on, that DROP cascades, and every
``session_uses`` row of a copied ``sessions`` was lost (SQLite's documented procedure for
such changes turns them off first).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from sandhold.errors import Conflict, NotFound, SandholdError

MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATION_LOCK_ID = 0x5A4D_0001  # PostgreSQL advisory lock held while migrating


def run_migrations(engine: Engine, direction: str = "upgrade", revision: str = "head") -> None:
    """``alembic upgrade|downgrade <revision>``; replicas migrating together take turns (an
    advisory lock on PostgreSQL, SQLite's write lock from the start on SQLite)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.connect() as conn:
        if conn.dialect.name != "sqlite":
            with conn.begin():
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_ID})
                cfg.attributes["connection"] = conn
                getattr(command, direction)(cfg, revision)
            return
        _sqlite(conn, cfg, direction, revision)


def _sqlite(conn: Connection, cfg: Config, direction: str, revision: str) -> None:
    raw = conn.connection.dbapi_connection
    assert raw is not None
    legacy = raw.isolation_level  # type: ignore[attr-defined]
    conn.exec_driver_sql("PRAGMA foreign_keys=OFF")  # ignored inside a transaction: before it
    conn.commit()
    # pysqlite opens transactions itself only before DML, so DDL would commit as it goes;
    # with its implicit transactions off, our BEGIN holds the whole migration.
    raw.isolation_level = None  # type: ignore[attr-defined]
    try:
        with conn.begin():
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            cfg.attributes["connection"] = conn
            getattr(command, direction)(cfg, revision)
            broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise SandholdError(
                    f"migration {direction} to {revision} refused and rolled back: "
                    f"{len(broken)} row(s) would reference rows that do not exist (first: "
                    f"table {broken[0][0]}, rowid {broken[0][1]}, referring to {broken[0][2]})"
                )
    finally:
        raw.isolation_level = legacy  # type: ignore[attr-defined]
        conn.exec_driver_sql("PRAGMA foreign_keys=ON")
        conn.commit()


def require_head(engine: Engine, where: str) -> None:
    """For a reader of a store it does not migrate (the CLI): NotFound when ``where`` holds no
    gateway store, Conflict when its schema is not this version's."""
    with engine.connect() as conn:
        revision = MigrationContext.configure(conn).get_current_revision()
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    if revision is None:
        raise NotFound(
            f"{where} holds no gateway store: `sandhold gateway serve` creates its "
            "tables at its first start"
        )
    if revision != head:
        raise Conflict(
            f"the gateway store at {where} has schema revision {revision}, this "
            f"version reads {head}: start `sandhold gateway serve` of this version "
            "once to migrate it"
        )
