"""`sandhold session`: the gateway's sessions and their timelines, read from its store."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from sandhold.cli.common import console, fail, load_settings
from sandhold.errors import InvalidRequest, NotFound, SandholdError, SessionNotFound, Unavailable

app = typer.Typer(no_args_is_help=True, help="Gateway sessions and their timelines.")


def _store() -> Any:
    """The gateway's store, opened for reading only if it is there: a SQLite file is never
    created here (an empty one would then answer "no such table")."""
    from sqlalchemy.engine import make_url

    from sandhold.store.db import Store
    from sandhold.store.schema import require_head

    url = make_url(load_settings().gateway_store)
    where = url.render_as_string(hide_password=True)
    if url.get_backend_name() == "sqlite":
        if not url.database or not Path(url.database).is_file():
            raise NotFound(
                f"no gateway store at {url.database}: `sandhold gateway serve` "
                "creates it at its first start (SANDHOLD_DATA_DIR or "
                "SANDHOLD_GATEWAY_STORE_URL choose another)"
            )
        where = url.database
    store = Store(url.render_as_string(hide_password=False))
    require_head(store.engine, where)
    return store


@contextlib.contextmanager
def _failing() -> Iterator[None]:
    """Errors of the tree, and the database's own (unreachable, locked, unreadable), exit with
    their status and one line instead of a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except SandholdError as e:
        fail(e)
    except SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        fail(Unavailable(f"cannot read the gateway store: {reason}"))


def _when(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@app.command("ls")
def session_ls(tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None) -> None:
    """List sessions with their current sandbox."""
    from rich.table import Table

    with _failing():
        rows = _store().sessions(tenant)
    table = Table("tenant", "session", "state", "sandbox", "created")
    for r in rows:
        table.add_row(r.tenant_id, r.session_id, r.state, r.sandbox_id or "-", _when(r.created_at))
    console.print(table)


@app.command("timeline")
def session_timeline(
    session_id: str,
    tenant: Annotated[str | None, typer.Option(help="tenant (needed if ambiguous)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show a session's timeline: lifecycle events and tool calls, with durations."""
    from rich.table import Table

    from sandhold.gateway.timeline import event_json

    with _failing():
        store = _store()
        rows = [r for r in store.sessions(tenant) if r.session_id == session_id]
        if not rows:
            where = f" of tenant {tenant!r}" if tenant else ""
            raise SessionNotFound(f"session {session_id!r}{where} does not exist")
        if len(rows) > 1:
            raise InvalidRequest(f"{len(rows)} sessions named {session_id!r}; use --tenant")
        events = store.timeline(rows[0].tenant_id, session_id)
    events = sorted(events, key=lambda ev: (ev.at, ev.id))
    if as_json:
        print(json.dumps([event_json(ev) for ev in events], indent=2))
        return
    table = Table("at", "event", "sandbox", "tool", "ms", "exit", "in/out", "reason / error")
    for ev in events:
        io = f"{ev.bytes_in}/{ev.bytes_out}" if ev.bytes_in is not None else ""
        table.add_row(
            _when(ev.at),
            ev.kind,
            ev.sandbox_id or "",
            ev.tool or "",
            "" if ev.duration_ms is None else f"{ev.duration_ms:.0f}",
            "" if ev.exit_code is None else str(ev.exit_code),
            io,
            ev.error or ev.reason or "",
        )
    console.print(table)


@app.command("stats")
def session_stats(tenant: str) -> None:
    """Per-tenant aggregates: sessions, live sandboxes, events and tool calls."""
    with _failing():
        aggregates = _store().aggregates(tenant)
    console.print_json(json.dumps(aggregates))
