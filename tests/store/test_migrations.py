"""The store's Alembic migrations, on SQLite and on a real PostgreSQL (a throw-away server on a
unix socket): an empty database reaches head; a database at any revision, holding a row in every
table, reaches head with its rows intact and exactly the schema of a fresh one; every downgrade
gives back the schema of the revision below; and head is what ``store/models.py`` describes (no
pending autogenerate diff). On SQLite a migration runs with foreign keys off (batch mode's copy of
a table must not cascade) and is refused, rolled back whole, if it leaves a dangling reference."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, MetaData, Table, insert, inspect, select

from sandhold.errors import SandholdError
from sandhold.store.db import Store, make_engine
from sandhold.store.models import Base
from sandhold.store.schema import MIGRATIONS, run_migrations

SCRIPTS = ScriptDirectory(str(MIGRATIONS))
REVISIONS = [r.revision for r in reversed(list(SCRIPTS.walk_revisions()))]  # base first
HEAD = SCRIPTS.get_current_head()
VERSION_TABLE = "alembic_version"

# One row per table with a value in every column of head (none left NULL, so that a migration
# that loses or mangles a value is seen). At an older revision the columns it has are written.
ROWS: dict[str, dict[str, Any]] = {
    "tenants": {
        "id": "acme", "api_key_sha256": "ab" * 32,
        "policy": {"keep_alive_s": 60, "network": {"mode": "allowlist", "allow": ["a.test"]}},
        "created_at": 1.5, "updated_at": 2.5,
    },
    "sessions": {
        "id": 7, "tenant_id": "acme", "session_id": "conv-42", "state": "closed",
        "sandbox_id": "sbx-1", "sandbox_handle": {"traffic_token": "tok"}, "generation": 3,
        "recorded_pause_end_at": 10.25, "lock_owner": "r0:abc", "lock_until": 11.5,
        "create_reserved_until": 12.5, "created_at": 1.5, "closed_at": 13.0,
        "scenario": "grading",
    },
    "session_uses": {
        "id": "u1", "session_pk": 7, "sandbox_id": "sbx-1", "replica": "r0",
        "tool": "run_command", "started_at": 3.0, "expires_at": 4.0,
    },
    "deliverables": {
        "id": "d1", "tenant_id": "acme", "session_id": "conv-42", "name": "report.csv",
        "source_path": "/workspace/out/report.csv", "size": 8, "sha256": "cd" * 32,
        "storage": "local", "key": "acme/conv-42/d1-report.csv", "url": "http://h/d1",
        "created_at": 5.0,
    },
    "events": {
        "id": 1, "at": 6.0, "tenant_id": "acme", "session_id": "conv-42", "kind": "tool_call",
        "sandbox_id": "sbx-1", "tool": "run_command", "duration_ms": 12.5, "exit_code": 0,
        "bytes_in": 10, "bytes_out": 20, "error": "boom", "reason": "keep-alive",
        "provider_state": {"state": "running"}, "replica": "r0",
        "texts": {"input": "ls", "stdout": "a\n"},
    },
    "event_rollups": {
        "span_s": 3600, "start_at": 1_767_222_000, "tenant_id": "acme", "scenario": "grading",
        "events": 12, "tool_calls": 9, "failures": 2, "failure_classes": {"not_found": 2},
        "latency": {"87": 5, "88": 4}, "running_s": 1800.5, "paused_s": 600.25,
    },
    "event_rollup_mark": {"id": 1, "first_hour": 1_767_218_400, "last_hour": 1_767_222_000,
                          "seen_event_id": 1, "updated_at": 14.0},
    "tunnels": {
        "id": "tunnel_" + "0" * 32, "tenant_id": "acme", "name": "corp", "description": "d",
        "token_sha256": "ef" * 32, "token_sealed": {"key": "k", "nonce": "n", "data": "x"},
        "created_at": 7.0, "updated_at": 7.5,
    },
    "tunnel_connectors": {
        "tunnel_id": "tunnel_" + "0" * 32, "instance_id": "i1", "client_name": "sandhold",
        "client_version": "0.1.0", "channels": ["main"], "replica": "r0",
        "first_seen_at": 8.0, "last_seen_at": 8.5,
    },
    "tunnel_requests": {
        "id": "treq_1", "tunnel_id": "tunnel_" + "0" * 32, "channel": "main",
        "method": "tools/call", "payload": "{}", "state": "done", "shard_token": "s1",
        "created_at": 9.0, "expires_at": 9.5, "delivered_to": "i1", "delivered_at": 9.1,
        "response": "{}", "responded_at": 9.2,
    },
    "fleet_hosts": {
        "host_id": "node-1", "address": "http://198.19.0.11:49982", "boot_id": "b1",
        "state": "ready", "capacity": 4, "info": {"used": 1}, "last_seen": 10.0,
    },
    "fleet_sandboxes": {
        "sandbox_id": "sbx-1", "team": "acme", "host_id": "node-1", "generation": 2,
        "state": "paused", "stored": True, "listed": {"sandboxID": "sbx-1"},
        "started_at": 10.5, "updated_at": 11.0,
    },
}  # fmt: skip


@pytest.fixture(params=["sqlite", "postgresql"])
def new_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Engine]]:
    """Makes empty databases of the backend under test; disposes of their engines at the end."""
    engines: list[Engine] = []

    def make() -> Engine:
        name = f"m{uuid.uuid4().hex[:12]}"
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / name}.db"
        else:
            url = request.getfixturevalue("postgres").database(name)
        engines.append(make_engine(url))
        return engines[-1]

    yield make
    for engine in engines:
        engine.dispose()


def migrate(engine: Engine, direction: str, revision: str) -> None:
    """``alembic upgrade|downgrade <revision>`` the way the store migrates (schema.py)."""
    run_migrations(engine, direction, revision)


def current(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def schema(engine: Engine) -> dict[str, Any]:
    """Tables, columns, keys, constraints and indexes, as the database itself reports them."""
    out: dict[str, Any] = {}
    with engine.connect() as conn:
        insp = inspect(conn)
        for t in sorted(set(insp.get_table_names()) - {VERSION_TABLE}):
            out[t] = {
                "columns": [
                    (c["name"], c["type"].compile(engine.dialect), c["nullable"], c["default"])
                    for c in insp.get_columns(t)
                ],
                "primary_key": insp.get_pk_constraint(t)["constrained_columns"],
                "foreign_keys": sorted(_foreign_key(fk) for fk in insp.get_foreign_keys(t)),
                "unique": sorted(
                    (u["name"] or "", u["column_names"]) for u in insp.get_unique_constraints(t)
                ),
                "indexes": sorted(
                    (i["name"] or "", i["column_names"], bool(i["unique"]))
                    for i in insp.get_indexes(t)
                ),
            }
    return out


def _foreign_key(fk: Any) -> tuple[Any, ...]:
    options = sorted(fk["options"].items())
    return (fk["constrained_columns"], fk["referred_table"], fk["referred_columns"], options)


def tables(engine: Engine) -> dict[str, Table]:
    """The store's tables as they are now, referenced tables before those referring to them."""
    meta = MetaData()
    meta.reflect(engine)
    return {t.name: t for t in meta.sorted_tables if t.name != VERSION_TABLE}


def put_rows(engine: Engine) -> dict[str, dict[str, Any]]:
    """Write ROWS as far as the schema has their columns; returns what was written."""
    written = {}
    with engine.begin() as conn:
        for name, table in tables(engine).items():
            missing = {c.name for c in table.columns} - set(ROWS[name])
            assert not missing, f"ROWS[{name!r}] has no value for {sorted(missing)}"
            row = {k: v for k, v in ROWS[name].items() if k in table.columns}
            conn.execute(insert(table).values(row))
            written[name] = row
    return written


def read_rows(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    with engine.connect() as conn:
        return {
            name: [dict(r._mapping) for r in conn.execute(select(table))]
            for name, table in tables(engine).items()
        }


def test_the_revisions_are_one_line() -> None:
    assert REVISIONS[0] == "0001" and REVISIONS[-1] == HEAD
    assert len(SCRIPTS.get_heads()) == 1, "the migrations branch: merge them"
    for below, above in itertools.pairwise(REVISIONS):
        assert SCRIPTS.get_revision(above).down_revision == below


def test_an_empty_database_reaches_head(new_database: Callable[[], Engine]) -> None:
    engine = new_database()
    store = Store(engine.url.render_as_string(hide_password=False))
    try:
        store.migrate()  # the production path (with its advisory lock on PostgreSQL)
        store.migrate()  # and again: a no-op at head
    finally:
        store.close()
    assert current(engine) == HEAD
    assert set(schema(engine)) == set(Base.metadata.tables)
    assert all(rows == [] for rows in read_rows(engine).values())


def test_the_models_match_head(new_database: Callable[[], Engine]) -> None:
    """Nothing for autogenerate to add: a model changed without a migration fails here."""
    engine = new_database()
    migrate(engine, "upgrade", "head")
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


@pytest.mark.parametrize("revision", REVISIONS)
def test_each_revision_reaches_head_with_its_rows(
    new_database: Callable[[], Engine], revision: str
) -> None:
    engine = new_database()
    migrate(engine, "upgrade", revision)
    assert current(engine) == revision
    written = put_rows(engine)
    assert set(written) == set(tables(engine))

    migrate(engine, "upgrade", "head")
    assert current(engine) == HEAD
    rows = read_rows(engine)
    for name, row in written.items():
        assert len(rows[name]) == 1, name
        assert {k: rows[name][0][k] for k in row} == row, name

    fresh = new_database()
    migrate(fresh, "upgrade", "head")
    assert schema(engine) == schema(fresh)


def test_each_downgrade_restores_the_revision_below(new_database: Callable[[], Engine]) -> None:
    """On SQLite, 0002's downgrade copies ``sessions`` (batch mode): its ``session_uses`` rows
    must survive the DROP of the original (they cascaded away with foreign keys on)."""
    engine = new_database()
    below = {"base": schema(engine)}  # the empty database
    for revision in REVISIONS:
        migrate(engine, "upgrade", revision)
        below[revision] = schema(engine)
    put_rows(engine)

    for revision in reversed(REVISIONS):
        target = SCRIPTS.get_revision(revision).down_revision or "base"
        assert isinstance(target, str)
        migrate(engine, "downgrade", target)
        assert current(engine) == (None if target == "base" else target)
        assert schema(engine) == below[target], f"downgrade {revision} -> {target}"
        # the rows of the tables that remain keep the values of the columns that remain
        rows = read_rows(engine)
        for name, table in tables(engine).items():
            kept = {c.name: ROWS[name][c.name] for c in table.columns}
            assert rows[name] == [kept], f"downgrade {revision} -> {target}: {name}"

    migrate(engine, "upgrade", "head")  # and up again from nothing
    assert schema(engine) == below[HEAD]


def test_a_migration_leaving_dangling_references_is_refused_and_rolled_back(
    tmp_path: Path,
) -> None:
    """Foreign keys are off while SQLite migrates, so nothing stops a migration from leaving a
    row that points nowhere: PRAGMA foreign_key_check does, before anything is committed (the
    DDL too), and the connection goes back to the pool with foreign keys on."""
    engine = make_engine(f"sqlite:///{tmp_path / 'dangling.db'}")
    try:
        migrate(engine, "upgrade", "0001")
        at_0001 = schema(engine)
        with engine.begin() as conn:  # what a faulty migration (or an old bug) leaves behind
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.execute(insert(tables(engine)["session_uses"]).values(
                {k: v for k, v in ROWS["session_uses"].items()}
            ))  # fmt: skip
        with pytest.raises(SandholdError, match=r"rolled back: 1 row.*session_uses"):
            migrate(engine, "upgrade", "head")
        assert current(engine) == "0001" and schema(engine) == at_0001
        assert len(read_rows(engine)["session_uses"]) == 1  # nothing removed either
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()
